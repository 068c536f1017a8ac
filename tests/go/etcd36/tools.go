//go:build tools

// Package tools pins etcd 3.6's commands (the yardstick: etcd, etcdctl, etcdutl), so that
// `go mod tidy` keeps them in go.sum.
package tools

import (
	_ "go.etcd.io/etcd/etcdctl/v3"
	_ "go.etcd.io/etcd/etcdutl/v3"
	_ "go.etcd.io/etcd/server/v3"
)
