package apiserver

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"etcd-witness/tests/go/kube/controlplane"
)

// eventually retries check every 200 ms until it returns nil or limit passes.
func eventually(t *testing.T, limit time.Duration, what string, check func() error) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, limit, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func clientset(t *testing.T) *kubernetes.Clientset {
	t.Helper()
	cs, err := cp.Client()
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

func kubectl(t *testing.T, stdin string, args ...string) string {
	t.Helper()
	started := time.Now()
	defer func() { t.Logf("kubectl %.60s: %v", strings.Join(args, " "), time.Since(started)) }()
	out, err := cp.Kubectl(stdin, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestReady: kube-apiserver's readiness and liveness include its etcd checks, and both
// members answer the probes a kubelet makes of kubeadm's etcd pod.
func TestReady(t *testing.T) {
	for _, probe := range []struct{ path, want string }{
		{"/readyz?verbose", "[+]etcd ok"},
		{"/readyz?verbose", "[+]etcd-readiness ok"},
		{"/livez?verbose", "[+]etcd ok"},
	} {
		code, body, err := cp.Get(probe.path)
		if err != nil || code != 200 || !strings.Contains(body, probe.want) {
			t.Errorf("kube-apiserver %s: %d %v, want %q in:\n%s", probe.path, code, err, probe.want, body)
		}
	}
	for i := range cp.Etcd.Members {
		for _, path := range []string{"/livez", "/readyz"} {
			code, body, err := cp.Etcd.Probe(i, path)
			if err != nil || code != 200 || body != "ok\n" {
				t.Errorf("member %d %s: %d %q %v", i, path, code, body, err)
			}
		}
	}
}

const crd = `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              size: {type: integer}
`

// The realistic set: per namespace, config maps, secrets, a deployment, leases and custom
// objects.
const (
	namespaces    = 10
	configMapsPer = 150
	secretsPer    = 40
	leasesPer     = 20
	widgetsPer    = 50
)

func realisticSet() string {
	var b strings.Builder
	doc := func(format string, args ...any) {
		b.WriteString("---\n")
		fmt.Fprintf(&b, format, args...)
	}
	for n := 0; n < namespaces; n++ {
		ns := fmt.Sprintf("e2e-%d", n)
		doc("apiVersion: v1\nkind: Namespace\nmetadata: {name: %s}\n", ns)
		for i := 0; i < configMapsPer; i++ {
			doc("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cm-%d, namespace: %s, labels: {set: e2e}}\ndata: {key: value-%d, more: %s}\n",
				i, ns, i, strings.Repeat("x", 200))
		}
		for i := 0; i < secretsPer; i++ {
			doc("apiVersion: v1\nkind: Secret\nmetadata: {name: secret-%d, namespace: %s, labels: {set: e2e}}\nstringData: {password: pw-%d}\n", i, ns, i)
		}
		doc(`apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: %s}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec: {containers: [{name: web, image: registry.k8s.io/pause:3.10}]}
`, ns)
		for i := 0; i < leasesPer; i++ {
			doc("apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata: {name: lease-%d, namespace: %s}\nspec: {holderIdentity: holder-%d, leaseDurationSeconds: 30}\n", i, ns, i)
		}
		for i := 0; i < widgetsPer; i++ {
			doc("apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: widget-%d, namespace: %s}\nspec: {size: %d}\n", i, ns, i)
		}
	}
	return b.String()
}

// TestKubectlCreatesAndChangesARealisticSet: a few thousand objects created and changed with
// kubectl; lists with and without pagination agree; the controllers act on the deployments.
func TestKubectlCreatesAndChangesARealisticSet(t *testing.T) {
	kubectl(t, crd, "apply", "-f", "-")
	kubectl(t, "", "wait", "--for=condition=Established", "--timeout=60s", "crd/widgets.example.com")
	set := realisticSet()
	started := time.Now()
	kubectl(t, set, "create", "-f", "-")
	objects := strings.Count(set, "---\n")
	took := time.Since(started)
	t.Logf("RESULT kubectl_create objects=%d seconds=%.1f per_second=%.0f", objects, took.Seconds(),
		float64(objects)/took.Seconds())

	kubectl(t, "", "label", "configmaps", "-n", "e2e-0", "-l", "set=e2e", "changed=yes")
	kubectl(t, "", "scale", "deployment", "web", "-n", "e2e-1", "--replicas=3")
	kubectl(t, "", "delete", "secrets", "-n", "e2e-2", "-l", "set=e2e")
	kubectl(t, "", "patch", "widget", "widget-7", "-n", "e2e-3", "--type=merge", "-p", `{"spec":{"size":700}}`)
	kubectl(t, "", "delete", "lease", "lease-3", "-n", "e2e-4")

	names := func(args ...string) []string {
		out := kubectl(t, "", append([]string{"get", "-o", "name"}, args...)...)
		lines := strings.Fields(out)
		sort.Strings(lines)
		return lines
	}
	for _, kind := range []string{"configmaps", "secrets", "widgets", "leases"} {
		// (a small page size makes many pages, but kubectl's client-side rate limit, 5 requests
		// a second after a burst of 10, then takes longer than anything on the server)
		paged := names(kind, "-A", "--chunk-size=97")
		whole := names(kind, "-A", "--chunk-size=0")
		if strings.Join(paged, ",") != strings.Join(whole, ",") {
			t.Errorf("%s: paged list (%d) differs from the whole one (%d)", kind, len(paged), len(whole))
		}
	}
	want := map[string]int{
		"configmaps": namespaces * configMapsPer,
		"secrets":    (namespaces - 1) * secretsPer,
	}
	for kind, n := range want {
		if got := len(names(kind, "-A", "-l", "set=e2e", "--chunk-size=50")); got != n {
			t.Errorf("%s: %d listed, want %d", kind, got, n)
		}
	}
	if got := len(names("configmaps", "-n", "e2e-0", "-l", "changed=yes")); got != configMapsPer {
		t.Errorf("labelled config maps: %d, want %d", got, configMapsPer)
	}
	if got := len(names("widgets", "-A")); got != namespaces*widgetsPer {
		t.Errorf("widgets: %d, want %d", got, namespaces*widgetsPer)
	}
	size := kubectl(t, "", "get", "widget", "widget-7", "-n", "e2e-3", "-o", "jsonpath={.spec.size}")
	if size != "700" {
		t.Errorf("patched widget's size: %q", size)
	}
	// kube-controller-manager's deployment and replica set controllers act through etcd-node.
	eventually(t, 60*time.Second, "the scaled deployment's pods", func() error {
		out := kubectl(t, "", "get", "pods", "-n", "e2e-1", "-l", "app=web", "-o", "name")
		if n := len(strings.Fields(out)); n != 3 {
			return fmt.Errorf("%d pods", n)
		}
		return nil
	})
}

// seen is one watch event as a watcher saw it.
type seen struct {
	kind  string
	name  string
	value string
	rv    string
}

// recorder keeps what a watcher saw, in order.
type recorder struct {
	mu     sync.Mutex
	events []seen
}

func (r *recorder) add(kind string, cm *corev1.ConfigMap) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, seen{kind, cm.Name, cm.Data["v"], cm.ResourceVersion})
}

func (r *recorder) snapshot() []seen {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]seen(nil), r.events...)
}

// informer runs a client-go informer of namespace ns's config maps until the test ends; what it
// saw, and how often it listed from scratch (a list, or a watch that sends the initial state).
func informer(t *testing.T, cs *kubernetes.Clientset, ns string) (*recorder, *int64Counter, cache.SharedIndexInformer) {
	t.Helper()
	rec := &recorder{}
	relists := &int64Counter{}
	ctx := context.Background()
	lw := &cache.ListWatch{
		ListFunc: func(o metav1.ListOptions) (runtime.Object, error) {
			relists.add()
			return cs.CoreV1().ConfigMaps(ns).List(ctx, o)
		},
		WatchFunc: func(o metav1.ListOptions) (watch.Interface, error) {
			if o.SendInitialEvents != nil && *o.SendInitialEvents {
				relists.add()
			}
			return cs.CoreV1().ConfigMaps(ns).Watch(ctx, o)
		},
	}
	inf := cache.NewSharedIndexInformer(lw, &corev1.ConfigMap{}, 0, cache.Indexers{})
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { rec.add("ADDED", o.(*corev1.ConfigMap)) },
		UpdateFunc: func(_, o any) { rec.add("MODIFIED", o.(*corev1.ConfigMap)) },
		DeleteFunc: func(o any) {
			if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = d.Obj
			}
			rec.add("DELETED", o.(*corev1.ConfigMap))
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	go inf.Run(stop)
	if !cache.WaitForCacheSync(stop, inf.HasSynced) {
		t.Fatal("the informer never synced")
	}
	return rec, relists, inf
}

type int64Counter struct {
	mu sync.Mutex
	n  int64
}

func (c *int64Counter) add() {
	c.mu.Lock()
	c.n++
	c.mu.Unlock()
}

func (c *int64Counter) get() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// kubectlWatch runs `kubectl get configmaps -w` on namespace ns until the test ends.
func kubectlWatch(t *testing.T, ns string) *recorder {
	t.Helper()
	bin, err := controlplane.Bin("kubectl")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--kubeconfig", cp.Kubeconfig, "get", "configmaps", "-n", ns,
		"-w", "--output-watch-events", "-o", "json")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	rec := &recorder{}
	go func() {
		dec := json.NewDecoder(out)
		for {
			var ev struct {
				Type   string           `json:"type"`
				Object corev1.ConfigMap `json:"object"`
			}
			if err := dec.Decode(&ev); err != nil {
				return
			}
			rec.add(ev.Type, &ev.Object)
		}
	}()
	return rec
}

// checkOrdered checks what a watcher saw: every change of the objects in want, in order, with
// resource versions that only grow (objects the test did not write, such as the namespace's
// kube-root-ca.crt, count only for the order).
func checkOrdered(t *testing.T, who string, got []seen, want map[string][]string) {
	t.Helper()
	perObject := map[string][]string{}
	var last uint64
	for _, e := range got {
		var rv uint64
		fmt.Sscan(e.rv, &rv)
		if e.kind != "DELETED" {
			if rv <= last {
				t.Errorf("%s: resource version went backwards: %d after %d (%+v)", who, rv, last, e)
			}
			last = rv
		}
		perObject[e.name] = append(perObject[e.name], e.kind+":"+e.value)
	}
	for name, w := range want {
		if g := perObject[name]; strings.Join(g, " ") != strings.Join(w, " ") {
			t.Errorf("%s: %s went %v, want %v", who, name, g, w)
		}
	}
}

// TestWatchersSeeEveryChangeInOrder: kubectl get -w and a client-go informer see every
// create, update and delete of 40 config maps, in order.
func TestWatchersSeeEveryChangeInOrder(t *testing.T) {
	cs := clientset(t)
	ctx := context.Background()
	const ns = "watch"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	inf, _, _ := informer(t, cs, ns)
	kw := kubectlWatch(t, ns)
	// (both watchers are open once they see a first object)
	mark := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "marker"}, Data: map[string]string{"v": "m"}}
	if _, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, mark, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, r := range []*recorder{inf, kw} {
		eventually(t, 30*time.Second, "the marker seen", func() error {
			if len(r.snapshot()) == 0 {
				return fmt.Errorf("nothing seen")
			}
			return nil
		})
	}
	want := map[string][]string{"marker": {"ADDED:m"}}
	const objects, rounds = 40, 3
	for i := 0; i < objects; i++ {
		name := fmt.Sprintf("cm-%d", i)
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"v": "0"}}
		if _, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		want[name] = []string{"ADDED:0"}
	}
	for r := 1; r <= rounds; r++ {
		for i := 0; i < objects; i++ {
			name := fmt.Sprintf("cm-%d", i)
			cm, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			cm.Data["v"] = fmt.Sprint(r)
			if _, err := cs.CoreV1().ConfigMaps(ns).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			want[name] = append(want[name], fmt.Sprintf("MODIFIED:%d", r))
		}
	}
	for i := 0; i < objects; i += 2 {
		name := fmt.Sprintf("cm-%d", i)
		if err := cs.CoreV1().ConfigMaps(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		want[name] = append(want[name], fmt.Sprintf("DELETED:%d", rounds))
	}
	for who, r := range map[string]*recorder{"informer": inf, "kubectl get -w": kw} {
		eventually(t, 60*time.Second, who+" sees every change", func() error {
			return missing(r.snapshot(), want)
		})
		checkOrdered(t, who, r.snapshot(), want)
	}
}

// missing says which object has fewer events than want (nil: none).
func missing(got []seen, want map[string][]string) error {
	count := map[string]int{}
	for _, e := range got {
		count[e.name]++
	}
	for name, w := range want {
		if count[name] < len(w) {
			return fmt.Errorf("%s: %d of %d events", name, count[name], len(w))
		}
	}
	return nil
}

// TestLeaderLeases: kube-controller-manager and kube-scheduler hold their leases through
// etcd-node, renew them, and one of the two controller managers leads.
func TestLeaderLeases(t *testing.T) {
	cs := clientset(t)
	ctx := context.Background()
	for _, name := range []string{"kube-controller-manager", "kube-scheduler"} {
		var first time.Time
		eventually(t, 60*time.Second, name+"'s lease held", func() error {
			l, err := cs.CoordinationV1().Leases("kube-system").Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" || l.Spec.RenewTime == nil {
				return fmt.Errorf("no holder yet")
			}
			first = l.Spec.RenewTime.Time
			return nil
		})
		eventually(t, 30*time.Second, name+"'s lease renewed", func() error {
			l, err := cs.CoordinationV1().Leases("kube-system").Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if !l.Spec.RenewTime.Time.After(first) {
				return fmt.Errorf("renewed last at %v", l.Spec.RenewTime.Time)
			}
			return nil
		})
	}
	for _, c := range cp.Controllers {
		if !c.Running() {
			t.Errorf("%s exited (log: %s)", c.Name, c.Log)
		}
	}
}
