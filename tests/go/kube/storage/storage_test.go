// Package storage runs Kubernetes' storage contract (the tests that
// k8s.io/apiserver/pkg/storage/testing exports and the etcd3 store passes against etcd) against
// etcd-node, through the real etcd3 store and etcd client that kube-apiserver uses. One cluster
// (two members and a witness) serves the whole run; each test gets a key prefix of its own,
// where etcd's own copy of these tests starts an etcd per test. The client balances over both
// members, so reads and watches meet the follower too.
//
// Tests of the etcd3 package that check its own internals (not the contract), and those that
// need a second etcd configuration, are not run here; docs/testing.md lists which and why.
package storage

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/kubernetes"

	"k8s.io/apimachinery/pkg/api/apitesting"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apiserver/pkg/apis/example"
	examplev1 "k8s.io/apiserver/pkg/apis/example/v1"
	"k8s.io/apiserver/pkg/features"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/apiserver/pkg/storage/etcd3"
	storagetesting "k8s.io/apiserver/pkg/storage/testing"
	"k8s.io/apiserver/pkg/storage/value"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/utils/clock"

	"etcd-witness/tests/go/kube/cluster"
)

var (
	scheme = runtime.NewScheme()
	codecs = serializer.NewCodecFactory(scheme)
	nodes  *cluster.Cluster
	// Each test's key prefix, by number.
	prefixes atomic.Int64
)

// transformerPrefix is what the tests' transformer puts before every stored value.
const transformerPrefix = "test!"

func init() {
	metav1.AddToGroupVersion(scheme, metav1.SchemeGroupVersion)
	utilruntime.Must(example.AddToScheme(scheme))
	utilruntime.Must(examplev1.AddToScheme(scheme))
}

func TestMain(m *testing.M) {
	cluster.Main(m, "storage-contract", func(dir string) (func(), error) {
		var err error
		// Bookmarks every second for the progress-notify tests (etcd's copy sets the same).
		nodes, err = cluster.Start(dir, cluster.Options{
			Flags: []string{"--experimental-watch-progress-notify-interval", "1s"},
		})
		if err != nil {
			return nil, err
		}
		return nodes.Stop, nil
	})
}

// swappable is the store's transformer: a PrefixTransformer that a test may replace for a
// while (what etcd's copy does by reaching into the store's private fields).
type swappable struct {
	mu      sync.Mutex
	base    *storagetesting.PrefixTransformer
	current value.Transformer
}

func (s *swappable) get() value.Transformer {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.current
}

func (s *swappable) TransformFromStorage(ctx context.Context, data []byte, dataCtx value.Context) ([]byte, bool, error) {
	return s.get().TransformFromStorage(ctx, data, dataCtx)
}

func (s *swappable) TransformToStorage(ctx context.Context, data []byte, dataCtx value.Context) ([]byte, error) {
	return s.get().TransformToStorage(ctx, data, dataCtx)
}

func (s *swappable) set(t value.Transformer) func() {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.current
	s.current = t
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.current = old
	}
}

// testStore is the etcd3 store of one test, with what the contract's helpers need.
type testStore struct {
	storage.Interface
	client      *kubernetes.Client
	transformer *swappable
	kv          *storagetesting.KVRecorder
	recorder    *storagetesting.KubernetesRecorder
	codec       runtime.Codec
	prefix      string
}

func (s *testStore) UpdatePrefixTransformer(modifier storagetesting.PrefixTransformerModifier) func() {
	copied := *s.transformer.base
	return s.transformer.set(modifier(&copied))
}

func (s *testStore) UpdateTransformer(modifier storagetesting.TransformerModifier) func() {
	return s.transformer.set(modifier(s.transformer.get()))
}

// newStore is a store over a fresh client of both members of the shared cluster, under a key
// prefix of its own.
func newStore(t *testing.T) (context.Context, *testStore) {
	t.Helper()
	return storeOn(t, nodes)
}

// newCompactingStore is a store on a cluster of its own: a test that compacts would make the
// revisions that other tests watch from (etcd's copy watches from revision 1) too old.
func newCompactingStore(t *testing.T) (context.Context, *testStore) {
	t.Helper()
	own, err := cluster.Start(t.TempDir(), cluster.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(own.Stop)
	return storeOn(t, own)
}

func storeOn(t *testing.T, nodes *cluster.Cluster) (context.Context, *testStore) {
	client, err := kubernetes.New(clientv3.Config{
		Endpoints:   nodes.Endpoints(),
		DialTimeout: 10 * time.Second,
		TLS:         nodes.TLSConfig(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	recorder := storagetesting.NewKubernetesRecorder(client.Kubernetes)
	kv := storagetesting.NewKVRecorder(client.KV, recorder)
	client.KV = kv
	client.Kubernetes = recorder
	base := storagetesting.NewPrefixTransformer([]byte(transformerPrefix), false)
	transformer := &swappable{base: base, current: base}
	codec := apitesting.TestCodec(codecs, examplev1.SchemeGroupVersion)
	versioner := storage.APIObjectVersioner{}
	compactor := etcd3.NewCompactor(client.Client, 0, clock.RealClock{}, nil)
	t.Cleanup(compactor.Stop)
	lease := etcd3.NewDefaultLeaseManagerConfig()
	// (etcd's copy: the tests cannot wait a minute for a lease to be reused)
	lease.ReuseDurationSeconds = 1
	prefix := fmt.Sprintf("/contract-%d", prefixes.Add(1))
	s, err := etcd3.New(client, compactor, codec, func() runtime.Object { return &example.Pod{} },
		func() runtime.Object { return &example.PodList{} }, prefix, "/pods/",
		schema.GroupResource{Resource: "pods"}, transformer, lease,
		etcd3.NewDefaultDecoder(codec, versioner), versioner)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return context.Background(), &testStore{
		Interface: s, client: client, transformer: transformer, kv: kv, recorder: recorder,
		codec: codec, prefix: prefix,
	}
}

// stored checks what the store wrote under key: the transformer's prefix, then an object
// without a resource version (etcd's copy checks the same).
func (s *testStore) stored() storagetesting.KeyValidation {
	return func(ctx context.Context, t *testing.T, key string) {
		resp, err := s.client.KV.Get(ctx, s.prefix+key)
		if err != nil {
			t.Fatalf("get %s: %v", key, err)
		}
		if len(resp.Kvs) == 0 {
			t.Fatalf("nothing stored at %s%s", s.prefix, key)
		}
		raw := resp.Kvs[0].Value
		if !strings.HasPrefix(string(raw), transformerPrefix) {
			t.Fatalf("the stored value of %s lacks the transformer's prefix: %q", key, raw)
		}
		obj, err := runtime.Decode(s.codec, raw[len(transformerPrefix):])
		if err != nil {
			t.Fatalf("decode %s: %v", key, err)
		}
		if pod := obj.(*example.Pod); pod.ResourceVersion != "" || pod.SelfLink != "" {
			t.Errorf("the object stored at %s has a resource version or a self link", key)
		}
	}
}

func (s *testStore) increaseRV() storagetesting.IncreaseRVFunc {
	return func(ctx context.Context, t *testing.T) int64 {
		resp, err := s.client.KV.Put(ctx, "increaseRV", "ok")
		if err != nil {
			t.Fatalf("could not update increaseRV: %v", err)
		}
		return resp.Header.Revision
	}
}

// compaction compacts etcd at resourceVersion, as kube-apiserver's compactor does, and waits
// until the store has seen it.
func (s *testStore) compaction() storagetesting.Compaction {
	return func(ctx context.Context, t *testing.T, resourceVersion string) {
		rv, err := storage.APIObjectVersioner{}.ParseResourceVersion(resourceVersion)
		if err != nil {
			t.Fatal(err)
		}
		// (kube-apiserver's compactor: a compare-and-swap of the compaction key's version, then
		// the compaction; the version is read first, as the store's compactor remembers it)
		resp, err := s.client.KV.Get(ctx, "compact_rev_key")
		if err != nil {
			t.Fatal(err)
		}
		var version int64
		if len(resp.Kvs) > 0 {
			version = resp.Kvs[0].Version
		}
		if _, _, got, err := etcd3.Compact(ctx, s.client.Client, version, int64(rv)); err != nil || got != int64(rv) {
			t.Fatalf("compaction at %d: compacted at %d, %v", rv, got, err)
		}
		// (only a store that lists from its cache's snapshots follows the compaction)
		if !utilfeature.DefaultFeatureGate.Enabled(features.ListFromCacheSnapshot) {
			return
		}
		deadline := time.Now().Add(30 * time.Second)
		for s.CompactRevision() != int64(rv) {
			if time.Now().After(deadline) {
				t.Fatalf("the store never saw the compaction at %d (it has %d)", rv, s.CompactRevision())
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}
