package main

// cert-manager's controller and cainjector, from the packages of the root module
// github.com/cert-manager/cert-manager (its cmd/* modules replace the root module with a local
// path, so the Go module proxy cannot build them, and their app packages import internal ones).
// Only what the e2e tests' issuers need runs: the SelfSigned and CA issuers, the approver and the
// Certificate controllers; no webhook, no ACME.

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	cmscheme "github.com/cert-manager/cert-manager/pkg/api"
	cmcontroller "github.com/cert-manager/cert-manager/pkg/controller"
	"github.com/cert-manager/cert-manager/pkg/controller/cainjector"
	utilfeature "github.com/cert-manager/cert-manager/pkg/util/feature"
	// The controllers register themselves with cmcontroller.Known().
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/approver"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/ca"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/selfsigned"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/issuing"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/keymanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/readiness"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/requestmanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/revisionmanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/trigger"
	_ "github.com/cert-manager/cert-manager/pkg/controller/issuers"
	// The issuer kinds those controllers use.
	_ "github.com/cert-manager/cert-manager/pkg/issuer/ca"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/selfsigned"
)

func init() {
	register("cert-manager-controller", runCertManagerController)
	register("cainjector", runCAInjector)
}

// certManagerControllers are the controllers started, by their registered names.
var certManagerControllers = []string{
	"issuers",
	"certificaterequests-approver",
	"certificaterequests-issuer-ca",
	"certificaterequests-issuer-selfsigned",
	"certificates-trigger",
	"certificates-key-manager",
	"certificates-request-manager",
	"certificates-issuing",
	"certificates-readiness",
	"certificates-revision-manager",
}

func signalContext() context.Context {
	ctx, _ := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	return ctx
}

// runCertManagerController: controlplane cert-manager-controller --kubeconfig FILE
func runCertManagerController(args []string) int {
	flags := flag.NewFlagSet("cert-manager-controller", flag.ContinueOnError)
	kubeconfig := flags.String("kubeconfig", "", "kubeconfig of the cluster")
	namespace := flags.String("cluster-resource-namespace", "cert-manager", "namespace of ClusterIssuers' Secrets")
	if err := flags.Parse(args); err != nil {
		return 2
	}
	ctx := signalContext()
	factory, err := cmcontroller.NewContextFactory(ctx, cmcontroller.ContextOptions{
		Kubeconfig:         *kubeconfig,
		KubernetesAPIQPS:   50,
		KubernetesAPIBurst: 100,
		IssuerOptions:      cmcontroller.IssuerOptions{ClusterResourceNamespace: *namespace},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "cert-manager-controller:", err)
		return 1
	}
	var wg sync.WaitGroup
	for _, name := range certManagerControllers {
		construct, ok := cmcontroller.Known()[name]
		if !ok {
			fmt.Fprintf(os.Stderr, "cert-manager-controller: no controller %q registered\n", name)
			return 1
		}
		controller, err := construct(factory)
		if err != nil {
			fmt.Fprintf(os.Stderr, "cert-manager-controller: %s: %v\n", name, err)
			return 1
		}
		wg.Add(1)
		go func(name string, c cmcontroller.Interface) {
			defer wg.Done()
			klog.InfoS("starting controller", "controller", name)
			if err := c.Run(2, ctx); err != nil {
				klog.ErrorS(err, "controller failed", "controller", name)
				os.Exit(1)
			}
		}(name, controller)
	}
	built, err := factory.Build()
	if err != nil {
		fmt.Fprintln(os.Stderr, "cert-manager-controller:", err)
		return 1
	}
	built.KubeSharedInformerFactory.Start(ctx.Done())
	built.SharedInformerFactory.Start(ctx.Done())
	built.HTTP01ResourceMetadataInformersFactory.Start(ctx.Done())
	if built.GatewaySolverEnabled {
		built.GWShared.Start(ctx.Done())
	}
	wg.Wait()
	return 0
}

// runCAInjector: controlplane cainjector --kubeconfig FILE [--feature-gates A=false,...]
func runCAInjector(args []string) int {
	flags := flag.NewFlagSet("cainjector", flag.ContinueOnError)
	kubeconfig := flags.String("kubeconfig", "", "kubeconfig of the cluster")
	gates := flags.String("feature-gates", "", "cainjector feature gates, e.g. CAInjectorMerging=false")
	if err := flags.Parse(args); err != nil {
		return 2
	}
	if *gates != "" {
		if err := utilfeature.DefaultMutableFeatureGate.Set(*gates); err != nil {
			fmt.Fprintln(os.Stderr, "cainjector: --feature-gates:", err)
			return 2
		}
	}
	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, "cainjector:", err)
		return 1
	}
	// The field manager of cainjector's server-side applies is the user agent's first word, as
	// cert-manager's own main sets it (empty, the apiserver refuses the apply).
	config.UserAgent = "cert-manager-cainjector/v1.21.2"
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		clientgoscheme.AddToScheme,
		cmscheme.AddToScheme,
		apiextensionsv1.AddToScheme,
		admissionregistrationv1.AddToScheme,
	} {
		if err := add(scheme); err != nil {
			fmt.Fprintln(os.Stderr, "cainjector:", err)
			return 1
		}
	}
	ctrl.SetLogger(klog.NewKlogr())
	mgr, err := ctrl.NewManager(config, ctrl.Options{
		Scheme:  scheme,
		Metrics: metricsserver.Options{BindAddress: "0"},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "cainjector:", err)
		return 1
	}
	ctx := signalContext()
	err = cainjector.RegisterAllInjectors(ctx, mgr, cainjector.SetupOptions{
		EnableCertificatesDataSource: true,
		EnabledReconcilersFor: map[string]bool{
			"mutatingwebhookconfiguration":   true,
			"validatingwebhookconfiguration": true,
			"customresourcedefinition":       true,
		},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "cainjector:", err)
		return 1
	}
	if err := mgr.Start(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "cainjector:", err)
		return 1
	}
	return 0
}
