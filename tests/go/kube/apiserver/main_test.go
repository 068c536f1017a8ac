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
	"testing"

	"etcd-witness/tests/go/kube/cluster"
	"etcd-witness/tests/go/kube/controlplane"
)

var cp *controlplane.ControlPlane

func TestMain(m *testing.M) {
	cluster.Main(m, "kube-on-etcd-node", func(dir string) (func(), error) {
		var err error
		cp, err = controlplane.Start(dir)
		if err != nil {
			return nil, err
		}
		return cp.Stop, nil
	})
}
