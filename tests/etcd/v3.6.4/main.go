// Command etcd is the etcd release this module's go.mod pins, built from its published Go
// modules for the tests that run it (tests/common/members.rs, tests/backups.rs, the e2e
// suite): `etcd [flags]` is etcd's own main (etcdmain.Main, nothing changed), and
// `etcd etcdutl ...` the etcdutl of the same release, as the etcd image ships both (the restore
// Jobs run `etcdutl snapshot restore`). One module per release: one Go binary cannot link two
// releases of go.etcd.io/etcd/server/v3. tests/etcd/build.sh builds them all, cached.
package main

import (
	"os"

	"github.com/spf13/cobra"
	"go.etcd.io/etcd/etcdutl/v3/etcdutl"
	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "etcdutl" {
		os.Exit(runEtcdutl(os.Args[2:]))
	}
	etcdmain.Main(os.Args)
}

func runEtcdutl(args []string) int {
	root := &cobra.Command{
		Use:          "etcdutl",
		Short:        "An administrative command line tool for etcd3.",
		SilenceUsage: true,
	}
	root.PersistentFlags().StringVarP(&etcdutl.OutputFormat, "write-out", "w", "simple", "set the output format (fields, json, protobuf, simple, table)")
	root.AddCommand(
		etcdutl.NewDefragCommand(),
		etcdutl.NewSnapshotCommand(),
		etcdutl.NewHashKVCommand(),
		etcdutl.NewVersionCommand(),
	)
	root.SetArgs(args)
	if err := root.Execute(); err != nil {
		return 1
	}
	return 0
}
