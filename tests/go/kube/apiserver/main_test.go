// Package apiserver runs a Kubernetes control plane on etcd-node (kube-apiserver as kubeadm
// configures it against an external etcd, two kube-controller-managers and a kube-scheduler,
// all from the pinned k8s.io/kubernetes module) and judges etcd-node by what Kubernetes' own
// programs see: kubectl, client-go informers, leader leases, readiness; then the faults of a
// two-machine control plane: the etcd leader killed under load, the witness's storage gone,
// and the witness gone with a member killed.
//
// The tests run in file order on one control plane; each fault test leaves the cluster whole
// again for the next. Lines starting with RESULT are the measurements docs/kubernetes.md quotes.
package apiserver

import (
	"fmt"
	"os"
	"testing"

	"etcd-witness/tests/go/kube/controlplane"
)

var cp *controlplane.ControlPlane

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "kube-on-etcd-node-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	cp, err = controlplane.Start(dir)
	if err != nil {
		fmt.Fprintf(os.Stderr, "starting the control plane: %v (logs in %s)\n", err, dir)
		os.Exit(1)
	}
	code := m.Run()
	cp.Stop()
	if code == 0 {
		os.RemoveAll(dir)
	} else {
		fmt.Fprintf(os.Stderr, "the control plane's and etcd-node's logs are in %s\n", dir)
	}
	os.Exit(code)
}
