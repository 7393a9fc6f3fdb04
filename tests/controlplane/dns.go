package main

// controlplane dns: the cluster DNS of the real-node tests, the records Kubernetes' DNS
// specification asks for and the node's pods use, served from the apiserver's Services and
// EndpointSlices (watched with client-go informers), with github.com/miekg/dns (already in this
// module's graph through the apiserver). It stands in for CoreDNS, whose own build costs minutes.
//
//	controlplane dns --kubeconfig FILE --listen 10.244.0.1:53 [--domain cluster.local]
//
// Served (https://github.com/kubernetes/dns/blob/master/docs/specification.md):
//   - A  <service>.<ns>.svc.<domain>: the ClusterIP, or for a headless Service the addresses of
//     its ready endpoints (the EndpointSlice controller marks every endpoint ready when the
//     Service publishes not-ready addresses);
//   - A  <hostname>.<service>.<ns>.svc.<domain>: a ready endpoint with that hostname (a
//     StatefulSet's pods under their headless Service);
//   - PTR for an endpoint with a hostname: <hostname>.<service>.<ns>.svc.<domain> (etcd's peer
//     listener reverse-resolves a connecting peer's address and matches it against the peer
//     certificate's names);
//   - a name that exists with no record of the asked type: NOERROR with no answer; any other
//     name: NXDOMAIN, authoritatively (there is no upstream: the node pulls nothing).
// Not served: SRV, pod A records (a-b-c-d.ns.pod), ExternalName, IPv6.
// Once it listens (UDP and TCP) and the informers have synced it prints "listening ADDR".

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listerscorev1 "k8s.io/client-go/listers/core/v1"
	listersdiscoveryv1 "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/tools/clientcmd"
)

func init() {
	register("dns", runDNS)
}

const dnsTTL = 5

type clusterDNS struct {
	domain   string // "cluster.local." (lower case, trailing dot)
	services listerscorev1.ServiceLister
	slices   listersdiscoveryv1.EndpointSliceLister
}

func runDNS(args []string) int {
	flags := flag.NewFlagSet("dns", flag.ContinueOnError)
	kubeconfig := flags.String("kubeconfig", "", "kubeconfig of the apiserver to watch")
	listen := flags.String("listen", "", "address to serve on, UDP and TCP (host:port)")
	domain := flags.String("domain", "cluster.local", "the cluster domain")
	if err := flags.Parse(args); err != nil {
		return 2
	}
	if *kubeconfig == "" || *listen == "" {
		fmt.Fprintln(os.Stderr, "dns: --kubeconfig and --listen are required")
		return 2
	}
	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fmt.Fprintf(os.Stderr, "dns: %v\n", err)
		return 1
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		fmt.Fprintf(os.Stderr, "dns: %v\n", err)
		return 1
	}
	factory := informers.NewSharedInformerFactory(client, 0)
	server := &clusterDNS{
		domain:   dns.Fqdn(strings.ToLower(*domain)),
		services: factory.Core().V1().Services().Lister(),
		slices:   factory.Discovery().V1().EndpointSlices().Lister(),
	}
	ctx := context.Background()
	factory.Start(ctx.Done())
	synced, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	for kind, ok := range factory.WaitForCacheSync(synced.Done()) {
		if !ok {
			fmt.Fprintf(os.Stderr, "dns: %v did not sync within 60 s\n", kind)
			return 1
		}
	}
	udp, err := net.ListenPacket("udp", *listen)
	if err != nil {
		fmt.Fprintf(os.Stderr, "dns: %v\n", err)
		return 1
	}
	tcp, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintf(os.Stderr, "dns: %v\n", err)
		return 1
	}
	errs := make(chan error, 2)
	go func() { errs <- (&dns.Server{PacketConn: udp, Handler: server}).ActivateAndServe() }()
	go func() { errs <- (&dns.Server{Listener: tcp, Handler: server}).ActivateAndServe() }()
	fmt.Printf("listening %s\n", udp.LocalAddr())
	err = <-errs
	fmt.Fprintf(os.Stderr, "dns: %v\n", err)
	return 1
}

func (s *clusterDNS) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	reply := new(dns.Msg)
	reply.SetReply(req)
	reply.Authoritative = true
	if len(req.Question) != 1 {
		reply.Rcode = dns.RcodeFormatError
		_ = w.WriteMsg(reply)
		return
	}
	q := req.Question[0]
	name := strings.ToLower(q.Name)
	exists, answers := false, []dns.RR(nil)
	if strings.HasSuffix(name, ".in-addr.arpa.") {
		exists, answers = s.reverse(name, q)
	} else {
		var ips []net.IP
		exists, ips = s.forward(name)
		if q.Qtype == dns.TypeA || q.Qtype == dns.TypeANY {
			for _, ip := range ips {
				answers = append(answers, &dns.A{
					Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: dnsTTL},
					A:   ip,
				})
			}
		}
	}
	if !exists {
		reply.Rcode = dns.RcodeNameError
	}
	reply.Answer = answers
	_ = w.WriteMsg(reply)
}

// forward: whether the name exists, and its IPv4 addresses.
func (s *clusterDNS) forward(name string) (bool, []net.IP) {
	rest, ok := strings.CutSuffix(name, ".svc."+s.domain)
	if !ok {
		return false, nil
	}
	labels := strings.Split(rest, ".")
	var hostname, service, namespace string
	switch len(labels) {
	case 2:
		service, namespace = labels[0], labels[1]
	case 3:
		hostname, service, namespace = labels[0], labels[1], labels[2]
	default:
		return false, nil
	}
	svc, err := s.services.Services(namespace).Get(service)
	if err != nil {
		return false, nil
	}
	if hostname == "" && svc.Spec.ClusterIP != corev1.ClusterIPNone && svc.Spec.ClusterIP != "" {
		return true, []net.IP{net.ParseIP(svc.Spec.ClusterIP).To4()}
	}
	var ips []net.IP
	found := hostname == ""
	for _, ep := range s.endpoints(namespace, service) {
		if hostname != "" && (ep.Hostname == nil || *ep.Hostname != hostname) {
			continue
		}
		found = true
		for _, addr := range ep.Addresses {
			if ip := net.ParseIP(addr).To4(); ip != nil {
				ips = append(ips, ip)
			}
		}
	}
	return found, ips
}

// reverse: an endpoint address with a hostname answers with its full name.
func (s *clusterDNS) reverse(name string, q dns.Question) (bool, []dns.RR) {
	octets := strings.Split(strings.TrimSuffix(name, ".in-addr.arpa."), ".")
	if len(octets) != 4 {
		return false, nil
	}
	addr := strings.Join([]string{octets[3], octets[2], octets[1], octets[0]}, ".")
	slices, err := s.slices.List(labels.Everything())
	if err != nil {
		return false, nil
	}
	for _, slice := range slices {
		service := slice.Labels[discoveryv1.LabelServiceName]
		if service == "" || slice.AddressType != discoveryv1.AddressTypeIPv4 {
			continue
		}
		for _, ep := range slice.Endpoints {
			if ep.Hostname == nil || !ready(ep) {
				continue
			}
			for _, a := range ep.Addresses {
				if a != addr {
					continue
				}
				target := fmt.Sprintf("%s.%s.%s.svc.%s", *ep.Hostname, service, slice.Namespace, s.domain)
				if q.Qtype != dns.TypePTR && q.Qtype != dns.TypeANY {
					return true, nil
				}
				return true, []dns.RR{&dns.PTR{
					Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypePTR, Class: dns.ClassINET, Ttl: dnsTTL},
					Ptr: target,
				}}
			}
		}
	}
	return false, nil
}

// endpoints: the ready IPv4 endpoints of a Service, across its slices.
func (s *clusterDNS) endpoints(namespace, service string) []discoveryv1.Endpoint {
	selector := labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: service})
	slices, err := s.slices.EndpointSlices(namespace).List(selector)
	if err != nil {
		return nil
	}
	var out []discoveryv1.Endpoint
	for _, slice := range slices {
		if slice.AddressType != discoveryv1.AddressTypeIPv4 {
			continue
		}
		for _, ep := range slice.Endpoints {
			if ready(ep) {
				out = append(out, ep)
			}
		}
	}
	return out
}

// ready: an endpoint whose ready condition is unset counts as ready (the API's rule).
func ready(ep discoveryv1.Endpoint) bool {
	return ep.Conditions.Ready == nil || *ep.Conditions.Ready
}
