module github.com/etcd-webhook/etcd-webhook/tests/node/pause

go 1.26.0
