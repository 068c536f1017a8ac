// Package lockelection judges etcd's Lock and Election services with etcd 3.6's own Go
// clients: the generated v3lock and v3election clients, and the concurrency package's Mutex
// and Election, which build the same recipe from KV, watches and leases on the client side and
// must exclude the services' holders. The tests run against $ETCD_ENDPOINTS (comma-separated
// client URLs): etcd-node/tests/e2e/cluster.rs runs them against etcd-node and against etcd 3.6,
// and both must pass.
package lockelection

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3election/v3electionpb"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3lock/v3lockpb"
)

func client(t *testing.T) *clientv3.Client {
	t.Helper()
	endpoints := os.Getenv("ETCD_ENDPOINTS")
	if endpoints == "" {
		t.Fatal("set ETCD_ENDPOINTS to the client URLs of the cluster to judge (comma-separated)")
	}
	c, err := clientv3.New(clientv3.Config{
		Endpoints:   strings.Split(endpoints, ","),
		DialTimeout: 5 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// unique is a name no earlier run used (the tests may run twice against one cluster).
func unique(t *testing.T) []byte {
	return []byte(fmt.Sprintf("%s-%d", t.Name(), time.Now().UnixNano()))
}

func grant(t *testing.T, c *clientv3.Client, ttl int64) clientv3.LeaseID {
	t.Helper()
	l, err := c.Grant(context.Background(), ttl)
	if err != nil {
		t.Fatal(err)
	}
	return l.ID
}

type lockResult struct {
	resp *v3lockpb.LockResponse
	err  error
}

func lockAsync(ctx context.Context, l v3lockpb.LockClient, name []byte, lease clientv3.LeaseID) chan lockResult {
	out := make(chan lockResult, 1)
	go func() {
		r, err := l.Lock(ctx, &v3lockpb.LockRequest{Name: name, Lease: int64(lease)})
		out <- lockResult{r, err}
	}()
	return out
}

// stillWaiting fails the test if the call answered within a second.
func stillWaiting(t *testing.T, ch chan lockResult) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("answered while another holds the lock: %+v %v", r.resp, r.err)
	case <-time.After(time.Second):
	}
}

func answer(t *testing.T, ch chan lockResult) lockResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(30 * time.Second):
		t.Fatal("no answer within 30 s")
		return lockResult{}
	}
}

func TestLockIsHeldByOneAtATimeInOrder(t *testing.T) {
	c := client(t)
	l := v3lockpb.NewLockClient(c.ActiveConnection())
	name := unique(t)
	first, err := l.Lock(context.Background(), &v3lockpb.LockRequest{Name: name, Lease: int64(grant(t, c, 60))})
	if err != nil {
		t.Fatal(err)
	}
	wantKey := fmt.Sprintf("%s/", name)
	if !strings.HasPrefix(string(first.Key), wantKey) {
		t.Fatalf("key %q, want it under %q", first.Key, wantKey)
	}
	second := lockAsync(context.Background(), l, name, grant(t, c, 60))
	stillWaiting(t, second)
	unlocked, err := l.Unlock(context.Background(), &v3lockpb.UnlockRequest{Key: first.Key})
	if err != nil {
		t.Fatal(err)
	}
	r := answer(t, second)
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.resp.Header.Revision < unlocked.Header.Revision {
		t.Fatalf("held at revision %d, before the unlock at %d", r.resp.Header.Revision, unlocked.Header.Revision)
	}
	// Locking again on the lease that holds it is the same acquisition.
	again, err := l.Lock(context.Background(), &v3lockpb.LockRequest{Name: name, Lease: mustLease(t, c, r.resp.Key)})
	if err != nil || string(again.Key) != string(r.resp.Key) {
		t.Fatalf("relock on the holder's lease: %+v %v", again, err)
	}
}

// mustLease is the lease a lock key is on.
func mustLease(t *testing.T, c *clientv3.Client, key []byte) int64 {
	t.Helper()
	g, err := c.Get(context.Background(), string(key))
	if err != nil || len(g.Kvs) != 1 {
		t.Fatalf("the lock's key %q: %v %v", key, g, err)
	}
	return g.Kvs[0].Lease
}

func TestAnEndedLeaseReleasesTheLockAndExpiresItsWaiter(t *testing.T) {
	c := client(t)
	l := v3lockpb.NewLockClient(c.ActiveConnection())
	name := unique(t)
	holder := grant(t, c, 60)
	if _, err := l.Lock(context.Background(), &v3lockpb.LockRequest{Name: name, Lease: int64(holder)}); err != nil {
		t.Fatal(err)
	}
	doomed := grant(t, c, 60)
	waiter := lockAsync(context.Background(), l, name, doomed)
	stillWaiting(t, waiter)
	if _, err := c.Revoke(context.Background(), doomed); err != nil {
		t.Fatal(err)
	}
	third := lockAsync(context.Background(), l, name, grant(t, c, 60))
	stillWaiting(t, third)
	if _, err := c.Revoke(context.Background(), holder); err != nil {
		t.Fatal(err)
	}
	if r := answer(t, waiter); r.err == nil || !strings.Contains(r.err.Error(), "session is expired") {
		t.Fatalf("the waiter whose lease ended: %+v %v, want \"mutex: session is expired\"", r.resp, r.err)
	}
	if r := answer(t, third); r.err != nil {
		t.Fatalf("the next waiter, once the holder's lease ended: %v", r.err)
	}
}

func TestAWaiterThatGivesUpLeavesNoKey(t *testing.T) {
	c := client(t)
	l := v3lockpb.NewLockClient(c.ActiveConnection())
	name := unique(t)
	if _, err := l.Lock(context.Background(), &v3lockpb.LockRequest{Name: name, Lease: int64(grant(t, c, 60))}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := l.Lock(ctx, &v3lockpb.LockRequest{Name: name, Lease: int64(grant(t, c, 60))}); err == nil {
		t.Fatal("a second holder while the first holds the lock")
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		g, err := c.Get(context.Background(), string(name)+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		if g.Count == 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d keys under the lock 10 s after the waiter gave up, want the holder's only", g.Count)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestTheServiceAndTheClientSideMutexExcludeEachOther(t *testing.T) {
	c := client(t)
	l := v3lockpb.NewLockClient(c.ActiveConnection())
	name := unique(t)
	s, err := concurrency.NewSession(c, concurrency.WithTTL(60))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	m := concurrency.NewMutex(s, string(name))
	if err := m.Lock(context.Background()); err != nil {
		t.Fatal(err)
	}
	service := lockAsync(context.Background(), l, name, grant(t, c, 60))
	stillWaiting(t, service)
	if err := m.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
	r := answer(t, service)
	if r.err != nil {
		t.Fatal(r.err)
	}
	if err := m.TryLock(context.Background()); err != concurrency.ErrLocked {
		t.Fatalf("the client-side mutex while the service's holder holds it: %v, want ErrLocked", err)
	}
}

func TestElectionCampaignLeaderProclaimObserveResign(t *testing.T) {
	c := client(t)
	e := v3electionpb.NewElectionClient(c.ActiveConnection())
	name := unique(t)
	ctx := context.Background()
	one, err := e.Campaign(ctx, &v3electionpb.CampaignRequest{Name: name, Lease: int64(grant(t, c, 60)), Value: []byte("one")})
	if err != nil {
		t.Fatal(err)
	}
	observeCtx, stop := context.WithCancel(ctx)
	defer stop()
	observed, err := e.Observe(observeCtx, &v3electionpb.LeaderRequest{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	next := func() string {
		t.Helper()
		r, err := observed.Recv()
		if err != nil {
			t.Fatal(err)
		}
		return string(r.Kv.Value)
	}
	if v := next(); v != "one" {
		t.Fatalf("observed %q first, want the leader's \"one\"", v)
	}
	two := make(chan error, 1)
	var twoLeader *v3electionpb.LeaderKey
	go func() {
		r, err := e.Campaign(ctx, &v3electionpb.CampaignRequest{Name: name, Lease: int64(grant(t, c, 60)), Value: []byte("two")})
		if err == nil {
			twoLeader = r.Leader
		}
		two <- err
	}()
	select {
	case err := <-two:
		t.Fatalf("a second leader while the first leads: %v", err)
	case <-time.After(time.Second):
	}
	if _, err := e.Proclaim(ctx, &v3electionpb.ProclaimRequest{Leader: one.Leader, Value: []byte("one again")}); err != nil {
		t.Fatal(err)
	}
	if v := next(); v != "one again" {
		t.Fatalf("observed %q after a proclaim, want \"one again\"", v)
	}
	l, err := e.Leader(ctx, &v3electionpb.LeaderRequest{Name: name})
	if err != nil || string(l.Kv.Value) != "one again" {
		t.Fatalf("leader: %+v %v", l, err)
	}
	if _, err := e.Resign(ctx, &v3electionpb.ResignRequest{Leader: one.Leader}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-two:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the second candidate did not lead within 30 s of the first resigning")
	}
	if v := next(); v != "two" {
		t.Fatalf("observed %q after the resignation, want \"two\"", v)
	}
	_, err = e.Proclaim(ctx, &v3electionpb.ProclaimRequest{Leader: one.Leader, Value: []byte("stale")})
	if err == nil || !strings.Contains(err.Error(), "election: not leader") {
		t.Fatalf("a proclaim by the resigned leader: %v, want \"election: not leader\"", err)
	}
	if _, err := e.Resign(ctx, &v3electionpb.ResignRequest{Leader: twoLeader}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Leader(ctx, &v3electionpb.LeaderRequest{Name: name}); err == nil || !strings.Contains(err.Error(), "election: no leader") {
		t.Fatalf("leader of an empty election: %v, want \"election: no leader\"", err)
	}
}

func TestTheClientSideElectionSeesTheServiceLeader(t *testing.T) {
	c := client(t)
	e := v3electionpb.NewElectionClient(c.ActiveConnection())
	name := unique(t)
	ctx := context.Background()
	if _, err := e.Campaign(ctx, &v3electionpb.CampaignRequest{Name: name, Lease: int64(grant(t, c, 60)), Value: []byte("service")}); err != nil {
		t.Fatal(err)
	}
	s, err := concurrency.NewSession(c, concurrency.WithTTL(60))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	el := concurrency.NewElection(s, string(name))
	l, err := el.Leader(ctx)
	if err != nil || string(l.Kvs[0].Value) != "service" {
		t.Fatalf("the client-side election's leader: %+v %v", l, err)
	}
	short, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if err := el.Campaign(short, "client"); err == nil {
		t.Fatal("the client-side candidate led while the service's leads")
	}
}

func TestObserveSeesEveryProclaimInOrder(t *testing.T) {
	c := client(t)
	e := v3electionpb.NewElectionClient(c.ActiveConnection())
	name := unique(t)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	leader, err := e.Campaign(ctx, &v3electionpb.CampaignRequest{Name: name, Lease: int64(grant(t, c, 60)), Value: []byte("v0")})
	if err != nil {
		t.Fatal(err)
	}
	observed, err := e.Observe(ctx, &v3electionpb.LeaderRequest{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	first, err := observed.Recv()
	if err != nil || string(first.Kv.Value) != "v0" {
		t.Fatalf("first observed: %+v %v", first, err)
	}
	const n = 20
	for i := 1; i <= n; i++ {
		if _, err := e.Proclaim(ctx, &v3electionpb.ProclaimRequest{Leader: leader.Leader, Value: []byte(fmt.Sprintf("v%d", i))}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 1; i <= n; i++ {
		r, err := observed.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if want := fmt.Sprintf("v%d", i); string(r.Kv.Value) != want {
			t.Fatalf("observed %q, want %q (every proclaim, in order)", r.Kv.Value, want)
		}
		if r.Header.Revision < r.Kv.ModRevision {
			t.Fatalf("header revision %d before the value's %d", r.Header.Revision, r.Kv.ModRevision)
		}
	}
}
