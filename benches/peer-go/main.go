// Command peer-go is the measured peer of etcd-webhook's admission webhooks: what a kubebuilder
// project gives an operator author (controller-runtime's webhook server, a CustomDefaulter and a
// CustomValidator over the typed EtcdCluster), with etcd-webhook's defaults and rules. The load
// harness (benches/load.py) and the apiserver-side run (the e2e runner's --bench-apiserver) start
// it beside the product. It serves
//
//	/mutate-etcd-example-com-v1-etcdcluster    (the path kubebuilder's markers give)
//	/validate-etcd-example-com-v1-etcdcluster
//
// over TLS from --cert-dir (tls.crt, tls.key, reloaded by controller-runtime's certwatcher), with
// HTTP/2 off as kubebuilder's scaffold leaves it, and /healthz, /readyz and /metrics
// (controller-runtime's registry) in plain HTTP on --health-addr. Once the webhook listener is up
// it prints one line: `peer-go listening addr=HOST:PORT`.
package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

const (
	mutatePath   = "/mutate-etcd-example-com-v1-etcdcluster"
	validatePath = "/validate-etcd-example-com-v1-etcdcluster"
)

func main() {
	host := flag.String("host", "127.0.0.1", "webhook listen address")
	port := flag.Int("port", 9443, "webhook port")
	certDir := flag.String("cert-dir", "", "folder holding tls.crt and tls.key")
	healthAddr := flag.String("health-addr", "127.0.0.1:0", "plain HTTP listener for /healthz, /readyz and /metrics")
	enableHTTP2 := flag.Bool("enable-http2", false, "serve HTTP/2 (kubebuilder's scaffold turns it off)")
	opts := zap.Options{}
	opts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))
	log := ctrl.Log.WithName("peer-go")

	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		fail(err)
	}
	if err := addToScheme(scheme); err != nil {
		fail(err)
	}

	var tlsOpts []func(*tls.Config)
	if !*enableHTTP2 {
		tlsOpts = append(tlsOpts, func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} })
	}
	server := webhook.NewServer(webhook.Options{Host: *host, Port: *port, CertDir: *certDir, TLSOpts: tlsOpts})
	server.Register(mutatePath, admission.WithCustomDefaulter(scheme, &EtcdCluster{}, &EtcdClusterCustomDefaulter{}))
	server.Register(validatePath, admission.WithCustomValidator(scheme, &EtcdCluster{}, &EtcdClusterCustomValidator{}))

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	health, err := net.Listen("tcp", *healthAddr)
	if err != nil {
		fail(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		if err := server.StartedChecker()(r); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.Handle("/metrics", promhttp.HandlerFor(ctrlmetrics.Registry, promhttp.HandlerOpts{}))
	go func() { _ = http.Serve(health, mux) }()

	errs := make(chan error, 1)
	go func() { errs <- server.Start(ctx) }()
	addr := net.JoinHostPort(*host, fmt.Sprint(*port))
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if server.StartedChecker()(nil) == nil {
			break
		}
		select {
		case err := <-errs:
			fail(err)
		default:
		}
		if time.Now().After(deadline) {
			fail(fmt.Errorf("the webhook server did not start on %s within 30 s", addr))
		}
	}
	log.Info("peer-go listening", "addr", addr, "health", health.Addr().String())
	fmt.Printf("peer-go listening addr=%s health=%s\n", addr, health.Addr())
	if err := <-errs; err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "peer-go:", err)
	os.Exit(1)
}
