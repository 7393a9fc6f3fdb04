package main

// The real node's parts (tests/e2e/node.rs): kube-scheduler, the kubelet and kube-proxy.
//
//	controlplane kube-scheduler|kubelet|kube-proxy [flags]

import (
	"context"

	"k8s.io/component-base/cli"
	proxy "k8s.io/kubernetes/cmd/kube-proxy/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

func init() {
	register("kube-scheduler", func(args []string) int {
		command := scheduler.NewSchedulerCommand()
		command.SetArgs(args)
		return cli.Run(command)
	})
	register("kubelet", func(args []string) int {
		command := kubelet.NewKubeletCommand(context.Background())
		command.SetArgs(args)
		return cli.Run(command)
	})
	register("kube-proxy", func(args []string) int {
		command := proxy.NewProxyCommand()
		command.SetArgs(args)
		return cli.Run(command)
	})
}
