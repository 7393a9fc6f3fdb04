package main

// controlplane network-policies: the real node's NetworkPolicy agent, kube-network-policies
// (sigs.k8s.io/kube-network-policies, the SIG Network project's nftables and nfqueue
// implementation) run as a host process with a kubeconfig instead of in-cluster, for the node
// named by --hostname-override. Upstream's main (cmd/main.go) with the in-cluster config
// replaced by --kubeconfig and without the AdminNetworkPolicy APIs (whose CRDs the tests do not
// install). Pod addresses come from the apiserver: the node's containerd runs without NRI, so
// the agent's NRI plugin never connects and its map of local pods stays empty. It is made all
// the same (NRIdisabled false, as upstream's main leaves it): v0.8.0 looks an address the
// apiserver does not know up in that map, and with NRI disabled there is no map (a nil
// dereference on the first packet from a non-pod address, met here).
//
//	controlplane network-policies --kubeconfig FILE --hostname-override NODE [--nfqueue-id N]
//	  [--metrics-bind-address ADDR]
//
// It queues the first packet of each new connection to or from a pod IP to user space, and
// accepts or drops it by the NetworkPolicies that select either end; traffic of the node's root
// user (the kubelet's probes, the tests' own clients) is never queued. On SIGINT or SIGTERM it
// deletes its nftables table before it exits. Once its rules are in place it prints "enforcing".

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/kube-network-policies/pkg/networkpolicy"
)

func init() {
	register("network-policies", runNetworkPolicies)
}

func runNetworkPolicies(args []string) int {
	flags := flag.NewFlagSet("network-policies", flag.ContinueOnError)
	kubeconfig := flags.String("kubeconfig", "", "kubeconfig of the apiserver to watch")
	node := flags.String("hostname-override", "", "the name of the Node this agent enforces for")
	queue := flags.Int("nfqueue-id", 100, "the nfqueue the rules send packets to")
	if err := flags.Parse(args); err != nil {
		return 2
	}
	if *kubeconfig == "" || *node == "" {
		fmt.Fprintln(os.Stderr, "network-policies: --kubeconfig and --hostname-override are required")
		return 2
	}
	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fmt.Fprintf(os.Stderr, "network-policies: %v\n", err)
		return 1
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		fmt.Fprintf(os.Stderr, "network-policies: %v\n", err)
		return 1
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer cancel()
	factory := informers.NewSharedInformerFactory(client, 0)
	controller, err := networkpolicy.NewController(
		client,
		factory.Networking().V1().NetworkPolicies(),
		factory.Core().V1().Namespaces(),
		factory.Core().V1().Pods(),
		nil, nil, nil, nil,
		networkpolicy.Config{
			QueueID:             *queue,
			NodeName:            *node,
			NetfilterBug1766Fix: true,
		},
	)
	if err != nil {
		fmt.Fprintf(os.Stderr, "network-policies: %v\n", err)
		return 1
	}
	done := make(chan error, 1)
	go func() { done <- controller.Run(ctx) }()
	factory.Start(ctx.Done())
	// Its rules go in once the caches have synced; say so for the tests.
	go func() {
		factory.WaitForCacheSync(ctx.Done())
		time.Sleep(time.Second)
		fmt.Println("enforcing")
	}()
	select {
	case err := <-done:
		// Run returns only on a failure before ctx ends (the nfqueue socket, say) or after it.
		if ctx.Err() == nil {
			fmt.Fprintf(os.Stderr, "network-policies: %v\n", err)
			return 1
		}
	case <-ctx.Done():
		// Run deletes the nftables table on its way out.
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			fmt.Fprintln(os.Stderr, "network-policies: the controller did not stop within 10 s")
			return 1
		}
	}
	return 0
}
