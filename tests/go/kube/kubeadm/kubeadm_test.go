// Package kubeadm runs kubeadm itself (Kubernetes 1.37.2, built from the pinned module) to make
// a control plane whose local etcd is etcd-node with a witness, on two "machines" (two addresses
// of the documentation range 198.51.100.0/24 added to this host's loopback interface, which
// needs root; kubeadm refuses a loopback address as a machine's): kubeadm's own phases write the
// certificates, the etcd static pod's manifest and kube-apiserver's, in dry-run mode (no
// kubelet or container runtime here: the manifests go to a directory). The test then runs what
// the manifests say, with etcd-node in place of etcd's image, probes the members as the kubelet
// would with the manifest's own probes, and uses kube-apiserver through kubeadm's super-admin
// kubeconfig. docs/kubernetes.md ("kubeadm with etcd-node as its local etcd") follows it.
package kubeadm

import (
	"crypto/tls"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"etcd-witness/tests/go/kube/cluster"
	"etcd-witness/tests/go/kube/controlplane"
)

type machine struct{ name, addr string }

var machines = []machine{{"a", "198.51.100.2"}, {"b", "198.51.100.3"}}

// addAddress gives this host `ip` (on lo) for the test.
func addAddress(t *testing.T, ip string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: it adds the machines' addresses to lo (scripts/test.sh runs as root)")
	}
	if out, err := exec.Command("ip", "addr", "add", ip+"/32", "dev", "lo").CombinedOutput(); err != nil &&
		!strings.Contains(string(out), "File exists") {
		t.Fatalf("ip addr add %s: %v: %s", ip, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "addr", "del", ip+"/32", "dev", "lo").Run() })
}

// config is kubeadm's configuration for one machine: its local etcd is a member of a cluster of
// both machines and the witness (`initial-cluster`); machine b, on the same host as a here,
// listens for clients and metrics on its own address only (on two real machines neither needs
// those two overrides).
func config(dir string, m machine, initialCluster string) string {
	extra := fmt.Sprintf("    - name: initial-cluster\n      value: %s\n", initialCluster)
	if m.name != "a" {
		extra += fmt.Sprintf("    - name: listen-client-urls\n      value: https://%s:2379\n", m.addr)
		extra += fmt.Sprintf("    - name: listen-metrics-urls\n      value: http://%s:2381\n", m.addr)
	}
	return fmt.Sprintf(`apiVersion: kubeadm.k8s.io/v1beta4
kind: InitConfiguration
localAPIEndpoint:
  advertiseAddress: %[2]s
  bindPort: 6443
nodeRegistration:
  name: %[1]s
---
apiVersion: kubeadm.k8s.io/v1beta4
kind: ClusterConfiguration
kubernetesVersion: v1.37.2
certificatesDir: %[3]s/pki
etcd:
  local:
    dataDir: %[3]s/etcd
    extraArgs:
%[4]s`, m.name, m.addr, dir, extra)
}

func run(t *testing.T, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(name), strings.Join(args, " "), err, out)
	}
	return string(out)
}

// manifest is the static pod kubeadm wrote in dry-run mode.
func manifest(t *testing.T, path string) corev1.Container {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var pod corev1.Pod
	if err := yaml.Unmarshal(data, &pod); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("%s: %d containers", path, len(pod.Spec.Containers))
	}
	return pod.Spec.Containers[0]
}

// startCommand runs a manifest's command with `bin` for its program, its output in `log`.
func startCommand(t *testing.T, bin, log string, command []string) *exec.Cmd {
	t.Helper()
	f, err := os.Create(log)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, command[1:]...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		f.Close()
	})
	return cmd
}

// probe makes a kubelet's HTTP probe of container c: GET scheme://host:port/path (a named port
// is the container's port of that name), success on 200-399.
func probe(c corev1.Container, p *corev1.Probe) (int, string, error) {
	g := p.HTTPGet
	port := g.Port.IntValue()
	for _, cp := range c.Ports {
		if g.Port.Type == intstr.String && cp.Name == g.Port.StrVal {
			port = int(cp.ContainerPort)
		}
	}
	u := fmt.Sprintf("%s://%s:%d%s", strings.ToLower(string(g.Scheme)), g.Host, port, g.Path)
	cl := &http.Client{Timeout: time.Duration(p.TimeoutSeconds) * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	return cluster.Get(cl, u)
}

// waitProbe makes probe p of container c until it passes; failing after `limit`, it shows the
// end of the process's log.
func waitProbe(t *testing.T, what, log string, c corev1.Container, p *corev1.Probe, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		code, body, err := probe(c, p)
		if err == nil && code >= 200 && code < 400 {
			return
		}
		if time.Now().After(deadline) {
			tail, _ := os.ReadFile(log)
			if len(tail) > 4000 {
				tail = tail[len(tail)-4000:]
			}
			t.Fatalf("%s: %s still fails after %s: %d %q %v; its log ends:\n%s", what, p.HTTPGet.Path, limit, code, body, err, tail)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func TestKubeadmControlPlaneWithEtcdNodeAsItsLocalEtcd(t *testing.T) {
	kubeadm, err := controlplane.Bin("kubeadm")
	if err != nil {
		t.Fatal(err)
	}
	apiserver, err := controlplane.Bin("kube-apiserver")
	if err != nil {
		t.Fatal(err)
	}
	kubectl, err := controlplane.Bin("kubectl")
	if err != nil {
		t.Fatal(err)
	}
	node, etcdutl, err := cluster.Binaries()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, m := range machines {
		addAddress(t, m.addr)
	}

	// The witness, once, where both machines reach it.
	witnessDir := filepath.Join(dir, "witness")
	if err := os.Mkdir(witnessDir, 0o700); err != nil {
		t.Fatal(err)
	}
	witness := "witness:mount?path=" + url.QueryEscape(witnessDir)
	run(t, nil, etcdutl, "witness", "init", "--name", "witness", "--advertise-peer-url", witness)
	initialCluster := fmt.Sprintf("a=https://%s:2380,b=https://%s:2380,witness=%s",
		machines[0].addr, machines[1].addr, witness)

	// kubeadm's certificates: every one on machine a; machine b gets a's CAs and service
	// account key (as `kubeadm join --control-plane` copies them) and makes its own leaves.
	var etcds []corev1.Container
	for i, m := range machines {
		mdir := filepath.Join(dir, m.name)
		cfg := filepath.Join(mdir, "kubeadm.yaml")
		if err := os.MkdirAll(filepath.Join(mdir, "pki", "etcd"), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(cfg, []byte(config(mdir, m, initialCluster)), 0o600); err != nil {
			t.Fatal(err)
		}
		if i > 0 {
			a := filepath.Join(dir, machines[0].name, "pki")
			for _, f := range []string{"ca.crt", "ca.key", "sa.key", "sa.pub", "front-proxy-ca.crt",
				"front-proxy-ca.key", "etcd/ca.crt", "etcd/ca.key"} {
				data, err := os.ReadFile(filepath.Join(a, f))
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(mdir, "pki", f), data, 0o600); err != nil {
					t.Fatal(err)
				}
			}
		}
		run(t, nil, kubeadm, "init", "phase", "certs", "all", "--config", cfg)
		out := filepath.Join(mdir, "manifests")
		env := []string{"KUBEADM_INIT_DRYRUN_DIR=" + out}
		run(t, env, kubeadm, "init", "phase", "etcd", "local", "--config", cfg, "--dry-run")
		run(t, env, kubeadm, "init", "phase", "control-plane", "apiserver", "--config", cfg, "--dry-run")
		etcd := manifest(t, filepath.Join(out, "etcd.yaml"))
		if etcd.Command[0] != "etcd" {
			t.Fatalf("kubeadm's etcd manifest runs %q", etcd.Command[0])
		}
		t.Logf("kubeadm's etcd command for %s: %s", m.name, strings.Join(etcd.Command, " "))
		etcds = append(etcds, etcd)
	}

	// Both members as the static pods would run them, etcd-node in place of etcd.
	for i, m := range machines {
		startCommand(t, node, filepath.Join(dir, m.name, "etcd.log"), etcds[i].Command)
	}
	// The kubelet: the startup probe until it passes, then liveness and readiness.
	for i, m := range machines {
		c := etcds[i]
		for _, p := range []*corev1.Probe{c.StartupProbe, c.LivenessProbe, c.ReadinessProbe} {
			if p == nil || p.HTTPGet == nil {
				t.Fatalf("kubeadm's etcd manifest for %s lacks an HTTP probe", m.name)
			}
		}
		limit := time.Duration(c.StartupProbe.FailureThreshold*c.StartupProbe.PeriodSeconds) * time.Second
		log := filepath.Join(dir, m.name, "etcd.log")
		waitProbe(t, "etcd-node "+m.name, log, c, c.StartupProbe, limit)
		waitProbe(t, "etcd-node "+m.name, log, c, c.LivenessProbe, 10*time.Second)
		waitProbe(t, "etcd-node "+m.name, log, c, c.ReadinessProbe, 10*time.Second)
	}

	// kube-apiserver as kubeadm's manifest runs it on machine a (its --etcd-servers: the local
	// member), then kubectl with kubeadm's kubeconfig.
	a := filepath.Join(dir, machines[0].name)
	api := manifest(t, filepath.Join(a, "manifests", "kube-apiserver.yaml"))
	t.Logf("kubeadm's kube-apiserver command: %s", strings.Join(api.Command, " "))
	apiLog := filepath.Join(a, "kube-apiserver.log")
	startCommand(t, apiserver, apiLog, api.Command)
	waitProbe(t, "kube-apiserver", apiLog, api, api.StartupProbe, 120*time.Second)
	code, body, err := probe(api, &corev1.Probe{TimeoutSeconds: 15, ProbeHandler: corev1.ProbeHandler{
		HTTPGet: &corev1.HTTPGetAction{Scheme: api.ReadinessProbe.HTTPGet.Scheme, Host: api.ReadinessProbe.HTTPGet.Host,
			Port: api.ReadinessProbe.HTTPGet.Port, Path: "/readyz?verbose"}}})
	if err != nil || code != 200 || !strings.Contains(body, "[+]etcd ok") {
		t.Fatalf("kube-apiserver /readyz?verbose: %d %v\n%s", code, err, body)
	}
	// (kubeadm's super-admin.conf: system:masters. admin.conf's group gets its rights from a
	// binding `kubeadm init` creates through the API after the control plane is up.)
	kubeconfigs := filepath.Join(a, "kubeconfigs")
	run(t, nil, kubeadm, "init", "phase", "kubeconfig", "super-admin", "--config", filepath.Join(a, "kubeadm.yaml"),
		"--kubeconfig-dir", kubeconfigs)
	admin := filepath.Join(kubeconfigs, "super-admin.conf")
	run(t, nil, kubectl, "--kubeconfig", admin, "create", "configmap", "through-kubeadm", "--from-literal=k=v")
	got := run(t, nil, kubectl, "--kubeconfig", admin, "get", "configmap", "through-kubeadm", "-o", "jsonpath={.data.k}")
	if got != "v" {
		t.Fatalf("kubectl read back %q", got)
	}
	// The member on machine b has it too: a range through its own client URL (etcd's JSON
	// gateway) with the client certificate kubeadm made for etcd's health check.
	cl, err := clientTLS(filepath.Join(dir, machines[1].name, "pki"))
	if err != nil {
		t.Fatal(err)
	}
	key := base64.StdEncoding.EncodeToString([]byte("/registry/configmaps/default/through-kubeadm"))
	resp, err := cl.Post(fmt.Sprintf("https://%s:2379/v3/kv/range", machines[1].addr), "application/json",
		strings.NewReader(`{"key":"`+key+`","count_only":true}`))
	if err != nil {
		t.Fatal(err)
	}
	reply, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(reply), `"count":"1"`) {
		t.Fatalf("machine b's member: %d %s", resp.StatusCode, reply)
	}
	fmt.Println("RESULT kubeadm: its certificates and its etcd and kube-apiserver manifests ran with etcd-node; the kubelet's probes passed; kubectl wrote through kube-apiserver and machine b's member has it")
}

// clientTLS is the client certificate kubeadm made for etcd's health check, trusted by the etcd
// CA.
func clientTLS(pki string) (*http.Client, error) {
	cert, err := tls.LoadX509KeyPair(filepath.Join(pki, "etcd", "healthcheck-client.crt"),
		filepath.Join(pki, "etcd", "healthcheck-client.key"))
	if err != nil {
		return nil, err
	}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		Certificates: []tls.Certificate{cert}, InsecureSkipVerify: true}}}, nil
}
