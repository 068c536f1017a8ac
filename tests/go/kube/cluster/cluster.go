// Package cluster starts etcd-node for the Kubernetes tier: two members and a witness in a
// local directory, real processes of the binaries the Rust build made, optionally with TLS and
// client certificates as kubeadm sets up an external etcd. It is the only launcher the Go tests
// have; everything they judge is reached through etcd's own client.
package cluster

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// RepoRoot is the repository these tests live in: the nearest directory above the working one
// that holds Cargo.lock.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "Cargo.lock")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no Cargo.lock above the working directory: run the tests in the repository")
		}
		dir = parent
	}
}

// Binaries names the etcd-node and etcdutl executables: $ETCD_NODE_BIN and $ETCDUTL_BIN, else
// the debug build of the repository these tests live in.
func Binaries() (node, etcdutl string, err error) {
	root, err := RepoRoot()
	if err != nil {
		return "", "", err
	}
	node = envOr("ETCD_NODE_BIN", filepath.Join(root, "target/debug/etcd-node"))
	etcdutl = envOr("ETCDUTL_BIN", filepath.Join(root, "target/debug/etcdutl"))
	for _, b := range []string{node, etcdutl} {
		if _, err := os.Stat(b); err != nil {
			return "", "", fmt.Errorf("%s is missing: build it with `cargo build -p etcd-node --bins` "+
				"or set ETCD_NODE_BIN and ETCDUTL_BIN", b)
		}
	}
	return node, etcdutl, nil
}

func envOr(name, fallback string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return fallback
}

// Member is one etcd-node process.
type Member struct {
	Name       string
	ClientPort int
	PeerPort   int
	// MetricsPort serves /metrics, /health, /livez and /readyz over plain HTTP, as kubeadm's
	// --listen-metrics-urls=http://127.0.0.1:2381.
	MetricsPort int
	cmd         *exec.Cmd
	done        chan struct{}
}

// Cluster is two members and a witness.
type Cluster struct {
	Dir     string
	Members []*Member
	PKI     *PKI
	node    string
	flags   []string
	initial string
}

// Main runs m's tests around what start brings up in a fresh temporary directory (named after
// what), stops it afterwards, and keeps the directory, saying where, when a test failed.
func Main(m *testing.M, what string, start func(dir string) (stop func(), err error)) {
	dir, err := os.MkdirTemp("", what+"-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	stop, err := start(dir)
	if err != nil {
		fmt.Fprintf(os.Stderr, "starting %s: %v (logs in %s)\n", what, err, dir)
		os.Exit(1)
	}
	code := m.Run()
	stop()
	if code == 0 {
		os.RemoveAll(dir)
	} else {
		fmt.Fprintf(os.Stderr, "the logs of %s are in %s\n", what, dir)
	}
	os.Exit(code)
}

// Options of a cluster.
type Options struct {
	// TLS: https client and peer URLs with client certificates (PKI made in Dir/pki).
	TLS bool
	// Flags added to every member's command line.
	Flags []string
}

// FreePort is a TCP port nothing listens on now, on 127.0.0.1.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Start makes dir's witness, then starts both members and waits until one leads.
func Start(dir string, o Options) (*Cluster, error) {
	node, etcdutl, err := Binaries()
	if err != nil {
		return nil, err
	}
	c := &Cluster{Dir: dir, node: node, flags: o.Flags}
	witness := filepath.Join(dir, "witness")
	if err := os.MkdirAll(witness, 0o700); err != nil {
		return nil, err
	}
	witnessURL := "witness:mount?path=" + url.QueryEscape(witness)
	out, err := exec.Command(etcdutl, "witness", "init", "--name", "w",
		"--advertise-peer-url", witnessURL).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("etcdutl witness init: %v: %s", err, out)
	}
	scheme := "http"
	if o.TLS {
		scheme = "https"
		if c.PKI, err = NewPKI(filepath.Join(dir, "pki"), []string{"m0", "m1"}); err != nil {
			return nil, err
		}
	}
	var peers []string
	for i := 0; i < 2; i++ {
		m := &Member{Name: fmt.Sprintf("m%d", i)}
		for _, p := range []*int{&m.ClientPort, &m.PeerPort, &m.MetricsPort} {
			if *p, err = FreePort(); err != nil {
				return nil, err
			}
		}
		c.Members = append(c.Members, m)
		peers = append(peers, fmt.Sprintf("%s=%s://127.0.0.1:%d", m.Name, scheme, m.PeerPort))
	}
	c.initial = strings.Join(append(peers, "w="+witnessURL), ",")
	for i := range c.Members {
		if err := c.StartMember(i); err != nil {
			c.Stop()
			return nil, err
		}
	}
	if _, err := c.WaitLeader(60 * time.Second); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

func (c *Cluster) scheme() string {
	if c.PKI != nil {
		return "https"
	}
	return "http"
}

// URL is member i's client URL.
func (c *Cluster) URL(i int) string {
	return fmt.Sprintf("%s://127.0.0.1:%d", c.scheme(), c.Members[i].ClientPort)
}

// Endpoints are both members' client URLs.
func (c *Cluster) Endpoints() []string {
	return []string{c.URL(0), c.URL(1)}
}

// Log is member i's log file.
func (c *Cluster) Log(i int) string {
	return filepath.Join(c.Dir, c.Members[i].Name+".log")
}

// StartMember starts member i (again) on its data directory.
func (c *Cluster) StartMember(i int) error {
	m := c.Members[i]
	if m.cmd != nil {
		return fmt.Errorf("%s is already running", m.Name)
	}
	peer := fmt.Sprintf("%s://127.0.0.1:%d", c.scheme(), m.PeerPort)
	args := []string{
		"--name", m.Name,
		"--data-dir", filepath.Join(c.Dir, m.Name+".etcd"),
		"--listen-client-urls", c.URL(i),
		"--advertise-client-urls", c.URL(i),
		"--listen-peer-urls", peer,
		"--initial-advertise-peer-urls", peer,
		"--listen-metrics-urls", fmt.Sprintf("http://127.0.0.1:%d", m.MetricsPort),
		"--initial-cluster", c.initial,
		"--initial-cluster-state", "new",
	}
	if c.PKI != nil {
		args = append(args, c.PKI.MemberFlags(m.Name)...)
	}
	args = append(args, c.flags...)
	log, err := os.OpenFile(c.Log(i), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command(c.node, args...)
	cmd.Stderr = log
	cmd.Env = append(os.Environ(), "RUST_LOG="+envOr("NODE_LOG", "info"))
	if err := cmd.Start(); err != nil {
		log.Close()
		return fmt.Errorf("start %s: %w", c.node, err)
	}
	m.cmd, m.done = cmd, make(chan struct{})
	go func(done chan struct{}) {
		_ = cmd.Wait()
		log.Close()
		close(done)
	}(m.done)
	return nil
}

func (c *Cluster) signal(i int, sig syscall.Signal) {
	m := c.Members[i]
	if m.cmd == nil {
		return
	}
	_ = m.cmd.Process.Signal(sig)
	<-m.done
	m.cmd = nil
}

// Kill stops member i with SIGKILL (a crash).
func (c *Cluster) Kill(i int) { c.signal(i, syscall.SIGKILL) }

// Stop stops every member with SIGTERM.
func (c *Cluster) Stop() {
	for i := range c.Members {
		c.signal(i, syscall.SIGTERM)
	}
}

// WitnessDir is the witness's directory (the share both members mount, in a real setup).
func (c *Cluster) WitnessDir() string { return filepath.Join(c.Dir, "witness") }

// HideWitness makes the witness's storage disappear (an unmounted share), RestoreWitness
// brings it back as it was.
func (c *Cluster) HideWitness() error {
	return os.Rename(c.WitnessDir(), c.WitnessDir()+".gone")
}

func (c *Cluster) RestoreWitness() error {
	return os.Rename(c.WitnessDir()+".gone", c.WitnessDir())
}

// Running says whether member i's process is up.
func (c *Cluster) Running(i int) bool { return c.Members[i].cmd != nil }

// TLSConfig is what a client presents: the CA and the "client" certificate (nil without TLS).
func (c *Cluster) TLSConfig() *tls.Config {
	if c.PKI == nil {
		return nil
	}
	cfg, err := c.PKI.ClientTLS("client")
	if err != nil {
		panic(fmt.Sprintf("the test PKI's client certificate: %v", err))
	}
	return cfg
}

// Client is an etcd client of both members.
func (c *Cluster) Client() (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{
		Endpoints:   c.Endpoints(),
		DialTimeout: 10 * time.Second,
		TLS:         c.TLSConfig(),
	})
}

// WaitLeader waits until a member says it leads; its index.
func (c *Cluster) WaitLeader(limit time.Duration) (int, error) {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		for i := range c.Members {
			if !c.Running(i) {
				continue
			}
			if leads, err := c.isLeader(i); err == nil && leads {
				return i, nil
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	return -1, fmt.Errorf("no member led within %v (logs in %s)", limit, c.Dir)
}

func (c *Cluster) isLeader(i int) (bool, error) {
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{c.URL(i)},
		DialTimeout: 2 * time.Second,
		TLS:         c.TLSConfig(),
	})
	if err != nil {
		return false, err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	s, err := cli.Status(ctx, c.URL(i))
	if err != nil {
		return false, err
	}
	return s.Leader == s.Header.MemberId, nil
}

// Probe GETs path on member i's metrics URL: the status code and the body.
func (c *Cluster) Probe(i int, path string) (int, string, error) {
	cl := &http.Client{Timeout: 20 * time.Second}
	return Get(cl, fmt.Sprintf("http://127.0.0.1:%d%s", c.Members[i].MetricsPort, path))
}

// Get GETs url with cl: the status code and the body.
func Get(cl *http.Client, url string) (int, string, error) {
	r, err := cl.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer r.Body.Close()
	body, err := io.ReadAll(r.Body)
	return r.StatusCode, string(body), err
}
