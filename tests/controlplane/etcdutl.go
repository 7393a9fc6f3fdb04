package main

// etcdutl v3.7.4 (the release the control plane's etcd is), as the etcd image ships it: the
// restore tests run `etcdutl snapshot restore` and `etcdutl snapshot status` from here.
//
//	controlplane etcdutl snapshot restore FILE --name ... --data-dir ...

import (
	"github.com/spf13/cobra"

	"go.etcd.io/etcd/etcdutl/v3/etcdutl"
)

func init() {
	register("etcdutl", runEtcdutl)
}

func runEtcdutl(args []string) int {
	root := &cobra.Command{
		Use:           "etcdutl",
		Short:         "An administrative command line tool for etcd3.",
		SilenceUsage:  true,
		SilenceErrors: false,
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
