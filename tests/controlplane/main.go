// Command controlplane is the real Kubernetes control plane of the end-to-end tests, built from the
// published Go modules: one multi-call binary (one link instead of three) whose first argument names
// the component.
//
//	controlplane etcd [etcd flags]
//	controlplane kube-apiserver [kube-apiserver flags]
//	controlplane kube-controller-manager [kube-controller-manager flags]
//	controlplane cert-manager-controller --kubeconfig FILE (certmanager.go)
//	controlplane cainjector --kubeconfig FILE
//	controlplane s3 --listen ADDR --data FILE --access-key KEY [--bucket NAME] (s3.go)
//	controlplane etcdutl snapshot restore|status ... (etcdutl.go)
//	controlplane etcdctl [etcdctl flags] (etcdctl.go)
//	controlplane otlp --grpc ADDR --http ADDR --out FILE (otlp.go)
//	controlplane kube-scheduler|kubelet|kube-proxy [flags]: the real node's parts (node.go)
//	controlplane dns --kubeconfig FILE --listen ADDR: the real node's cluster DNS (dns.go)
//	controlplane network-policies --kubeconfig FILE --hostname-override NODE: the real node's
//	  NetworkPolicy agent, kube-network-policies (netpol.go)
//
// oldest/ is a second module with the same main.go and certmanager.go (links to these files) pinned
// to the oldest Kubernetes and cert-manager the chart claims: etcd, kube-apiserver,
// kube-controller-manager, cert-manager-controller and cainjector only.
//
// The only change to upstream behaviour is the apiserver's service resolver: the apiserver refuses
// loopback Endpoints, so webhooks named by a service reference (as the shipped configurations do) are
// resolved through a file that the tests write, CONTROLPLANE_SERVICE_MAP, read on every call:
//
//	# namespace/name:port=host:port
//	etcd-system/etcd-webhook:443=127.0.0.1:40123
//
// A service that is not in the file resolves to an error, as a Service without ready endpoints does.
// The apiserver still checks the serving certificate against the service's DNS name.
package main

import (
	"bufio"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	_ "time/tzdata" // CronJob time zones, as upstream's mains do

	"go.etcd.io/etcd/server/v3/etcdmain"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
)

// A component: run with its arguments (without its own name), it returns the exit status.
type component func(args []string) int

// Every component this binary is built with. Each file registers its own (init), so that the
// module pinned to the oldest Kubernetes the chart claims (oldest/, which links only main.go and
// certmanager.go) builds the control plane without the node, the S3 server or the collector.
var components = map[string]component{}

func register(name string, run component) { components[name] = run }

func init() {
	register("etcd", func(args []string) int {
		etcdmain.Main(append([]string{"etcd"}, args...))
		return 0
	})
	register("kube-apiserver", func(args []string) int {
		if path := os.Getenv("CONTROLPLANE_SERVICE_MAP"); path != "" {
			apiserver.SetServiceResolverForTests(fileResolver{path: path})
		}
		command := apiserver.NewAPIServerCommand()
		command.SetArgs(args)
		return cli.Run(command)
	})
	register("kube-controller-manager", func(args []string) int {
		command := controllermanager.NewControllerManagerCommand()
		command.SetArgs(args)
		return cli.Run(command)
	})
}

func main() {
	// Called by the name of a link to it, as the real node's etcd image does
	// (/usr/local/bin/etcd, etcdutl and etcdctl, tests/e2e/node.rs): that tool.
	if run, found := components[filepath.Base(os.Args[0])]; found {
		os.Exit(run(os.Args[1:]))
	}
	names := make([]string, 0, len(components))
	for name := range components {
		names = append(names, name)
	}
	sort.Strings(names)
	usage := "usage: controlplane " + strings.Join(names, "|") + " [flags]"
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
	run, found := components[os.Args[1]]
	if !found {
		fmt.Fprintf(os.Stderr, "controlplane: unknown component %q\n%s\n", os.Args[1], usage)
		os.Exit(2)
	}
	os.Exit(run(os.Args[2:]))
}

// fileResolver resolves service references through the map file, read on every call so that a
// test can move or stop the webhook process without restarting the apiserver.
type fileResolver struct{ path string }

func (r fileResolver) ResolveEndpoint(namespace, name string, port int32) (*url.URL, error) {
	key := fmt.Sprintf("%s/%s:%d", namespace, name, port)
	file, err := os.Open(r.path)
	if err != nil {
		return nil, fmt.Errorf("service map %s: %w", r.path, err)
	}
	defer file.Close()
	lines := bufio.NewScanner(file)
	for lines.Scan() {
		line := strings.TrimSpace(lines.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		service, address, found := strings.Cut(line, "=")
		if found && strings.TrimSpace(service) == key {
			return &url.URL{Scheme: "https", Host: strings.TrimSpace(address)}, nil
		}
	}
	if err := lines.Err(); err != nil {
		return nil, fmt.Errorf("service map %s: %w", r.path, err)
	}
	return nil, fmt.Errorf("service %s has no endpoints in %s", key, r.path)
}
