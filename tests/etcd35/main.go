// Command etcd is etcd v3.5 (the release go.mod pins), built from its published Go modules for
// the tests that run an older etcd beside the control plane's v3.6: the rolling upgrade from
// v3.5 to v3.6 in tests/members.rs. The same main as etcd's own (etcdmain.Main), nothing changed.
// A separate module because one Go binary cannot link two minor releases of go.etcd.io/etcd/server/v3.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
