package main

// etcdctl v3.7.4 (the release the control plane's etcd is), as the etcd image ships it at
// /usr/local/bin/etcdctl: the member tests run `etcdctl member list` with exactly the ETCDCTL_*
// environment the rendered member pods carry, as `kubectl exec NAME-0 -- etcdctl ...` does.
//
//	controlplane etcdctl member list -w table

import (
	"os"

	"go.etcd.io/etcd/etcdctl/v3/ctlv3"
)

func init() {
	register("etcdctl", runEtcdctl)
}

func runEtcdctl(args []string) int {
	// ctlv3's root command reads os.Args, as etcdctl's own main does.
	os.Args = append([]string{"etcdctl"}, args...)
	if err := ctlv3.Start(); err != nil {
		return 1
	}
	return 0
}
