// Package controlplane runs a Kubernetes control plane on etcd-node as kubeadm configures one
// against an external etcd: kube-apiserver with both members in --etcd-servers and a client
// certificate, kube-controller-manager (two of them, competing for the lease) and
// kube-scheduler, each with leader election, all built from the k8s.io/kubernetes module
// pinned in this directory's go.mod (scripts/build-go.sh).
package controlplane

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"etcd-witness/tests/go/kube/cluster"
)

// Bin is a Kubernetes command built by scripts/build-go.sh: in $KUBE_BIN_DIR, else
// target/go/bin of this repository.
func Bin(name string) (string, error) {
	dir := os.Getenv("KUBE_BIN_DIR")
	if dir == "" {
		root, err := cluster.RepoRoot()
		if err != nil {
			return "", err
		}
		dir = filepath.Join(root, "target/go/bin")
	}
	path := filepath.Join(dir, name)
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("%s is missing: run `bash scripts/build-go.sh` (it builds the "+
			"Kubernetes commands into target/go/bin) or set KUBE_BIN_DIR", path)
	}
	return path, nil
}

// Process is one control-plane command.
type Process struct {
	Name string
	Log  string
	cmd  *exec.Cmd
	done chan struct{}
}

// Running says whether the process is still up.
func (p *Process) Running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Stop ends the process with SIGTERM and waits for it.
func (p *Process) Stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// ControlPlane is kube-apiserver, two kube-controller-managers and a kube-scheduler on an
// etcd-node cluster with TLS.
type ControlPlane struct {
	Etcd        *cluster.Cluster
	Dir         string
	Port        int
	Kubeconfig  string
	APIServer   *Process
	Controllers []*Process
	Scheduler   *Process
}

func start(dir, name string, args ...string) (*Process, error) {
	bin, err := Bin(strings.TrimRight(name, "-0123456789"))
	if err != nil {
		return nil, err
	}
	logPath := filepath.Join(dir, name+".log")
	log, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, err
	}
	p := &Process{Name: name, Log: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		log.Close()
		close(p.done)
	}()
	return p, nil
}

// Start starts etcd-node (two members, a witness, TLS) in dir, then the control plane, and
// waits until kube-apiserver is ready.
func Start(dir string) (*ControlPlane, error) {
	etcd, err := cluster.Start(filepath.Join(dir, "etcd"), cluster.Options{TLS: true})
	if err != nil {
		return nil, err
	}
	cp := &ControlPlane{Etcd: etcd, Dir: dir}
	if err := cp.start(); err != nil {
		cp.Stop()
		return nil, err
	}
	return cp, nil
}

func (cp *ControlPlane) start() error {
	pki := cp.Etcd.PKI
	saKey := filepath.Join(cp.Dir, "sa.key")
	saPub := filepath.Join(cp.Dir, "sa.pub")
	if err := serviceAccountKeys(saKey, saPub); err != nil {
		return err
	}
	var err error
	if cp.Port, err = cluster.FreePort(); err != nil {
		return err
	}
	cp.Kubeconfig = filepath.Join(cp.Dir, "admin.conf")
	if err := os.WriteFile(cp.Kubeconfig, []byte(fmt.Sprintf(kubeconfig,
		pki.CA(), cp.Port, pki.Cert("admin"), pki.Key("admin"))), 0o600); err != nil {
		return err
	}
	// kubeadm's kube-apiserver against an external etcd (its ClusterConfiguration's
	// etcd.external: endpoints, caFile, certFile, keyFile), default compaction interval and
	// watch cache.
	cp.APIServer, err = start(cp.Dir, "kube-apiserver",
		"--etcd-servers="+strings.Join(cp.Etcd.Endpoints(), ","),
		"--etcd-cafile="+pki.CA(),
		"--etcd-certfile="+pki.Cert("client"),
		"--etcd-keyfile="+pki.Key("client"),
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		// (a loopback address cannot be published as the kubernetes service's endpoint; a
		// real control plane advertises its machine's address instead)
		"--endpoint-reconciler-type=none",
		fmt.Sprintf("--secure-port=%d", cp.Port),
		"--tls-cert-file="+pki.Cert("apiserver"),
		"--tls-private-key-file="+pki.Key("apiserver"),
		"--client-ca-file="+pki.CA(),
		"--authorization-mode=Node,RBAC",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+saPub,
		"--service-account-signing-key-file="+saKey,
		"--service-cluster-ip-range=10.96.0.0/12",
		"--allow-privileged=true",
		"--enable-admission-plugins=NodeRestriction",
	)
	if err != nil {
		return err
	}
	if err := cp.WaitReady(120 * time.Second); err != nil {
		return err
	}
	for i := 0; i < 2; i++ {
		p, err := cp.component(fmt.Sprintf("kube-controller-manager-%d", i),
			"--service-account-private-key-file="+saKey,
			"--root-ca-file="+pki.CA(),
			"--use-service-account-credentials=true",
		)
		if err != nil {
			return err
		}
		cp.Controllers = append(cp.Controllers, p)
	}
	cp.Scheduler, err = cp.component("kube-scheduler")
	return err
}

// component starts a controller manager or scheduler: as the admin, electing a leader, serving
// on a free loopback port, with extra flags.
func (cp *ControlPlane) component(name string, extra ...string) (*Process, error) {
	port, err := cluster.FreePort()
	if err != nil {
		return nil, err
	}
	return start(cp.Dir, name, append([]string{
		"--kubeconfig=" + cp.Kubeconfig,
		"--authentication-kubeconfig=" + cp.Kubeconfig,
		"--authorization-kubeconfig=" + cp.Kubeconfig,
		"--leader-elect=true",
		"--bind-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", port),
	}, extra...)...)
}

const kubeconfig = `apiVersion: v1
kind: Config
clusters:
- name: etcd-node
  cluster:
    certificate-authority: %s
    server: https://127.0.0.1:%d
users:
- name: admin
  user:
    client-certificate: %s
    client-key: %s
contexts:
- name: admin@etcd-node
  context:
    cluster: etcd-node
    user: admin
current-context: admin@etcd-node
`

func serviceAccountKeys(keyPath, pubPath string) error {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return err
	}
	if err := os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{
		Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600); err != nil {
		return err
	}
	return os.WriteFile(pubPath, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o600)
}

// Stop stops the control plane, then etcd-node.
func (cp *ControlPlane) Stop() {
	for _, p := range append(append([]*Process{cp.Scheduler}, cp.Controllers...), cp.APIServer) {
		if p != nil {
			p.Stop()
		}
	}
	cp.Etcd.Stop()
}

// RESTConfig is the admin's client configuration.
func (cp *ControlPlane) RESTConfig() (*rest.Config, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", cp.Kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = 1000, 1000
	return cfg, nil
}

// Client is a client-go clientset of the admin.
func (cp *ControlPlane) Client() (*kubernetes.Clientset, error) {
	cfg, err := cp.RESTConfig()
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(cfg)
}

// Get GETs path on kube-apiserver as the admin: the status code and the body.
func (cp *ControlPlane) Get(path string) (int, string, error) {
	cfg, err := cp.Etcd.PKI.ClientTLS("admin")
	if err != nil {
		return 0, "", err
	}
	cl := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
	return cluster.Get(cl, fmt.Sprintf("https://127.0.0.1:%d%s", cp.Port, path))
}

// WaitReady waits until kube-apiserver's /readyz answers 200.
func (cp *ControlPlane) WaitReady(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	var last string
	for time.Now().Before(deadline) {
		if !cp.APIServer.Running() {
			return fmt.Errorf("kube-apiserver exited (log: %s)", cp.APIServer.Log)
		}
		code, body, err := cp.Get("/readyz")
		if err == nil && code == 200 {
			return nil
		}
		last = fmt.Sprintf("%d %s %v", code, body, err)
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("kube-apiserver not ready within %v: %s (log: %s)", limit, last, cp.APIServer.Log)
}

// Kubectl runs kubectl as the admin: its combined output.
func (cp *ControlPlane) Kubectl(stdin string, args ...string) (string, error) {
	bin, err := Bin("kubectl")
	if err != nil {
		return "", err
	}
	cmd := exec.Command(bin, append([]string{"--kubeconfig", cp.Kubeconfig}, args...)...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}
