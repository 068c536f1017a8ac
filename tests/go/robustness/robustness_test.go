//go:debug randseednop=0

// etcd's robustness suite (go.etcd.io/etcd/tests/v3/robustness, the 3.6 release) run against
// etcd-node. Everything that judges is etcd's: its traffic (in the shape of Kubernetes' and of
// etcd's own clients), its faults, its clients that record every request and watch event, and
// its validator (porcupine's linearizability check, then the watch and serializable-read
// checks). What is ours is the launcher, as etcd's own runner (robustness/main_test.go) would
// be with etcd-node as the binary:
//
//   - members are etcd-node processes started by etcd's e2e framework with the flags it builds;
//     a scenario of three members becomes two members and a witness in a local directory (its
//     --initial-cluster gains witness=witness:mount?path=...), one of one member stays one;
//   - the validator learns which requests were persisted from each member's WAL: etcd-node's
//     `etcdutl wal dump` gives every entry in etcd's own encoding, written here into an etcd WAL
//     that the suite's own reader (report.PersistedRequestsDirs) reads;
//   - faults: the suite's own that need no failpoint compiled into etcd (process kill, the peer
//     network blackholed, delayed and dropped through its proxy), and two of ours in its
//     Failpoint interface: a member paused (SIGSTOP) and the witness's storage gone while a
//     member is killed.
//
// Environment: ETCD_NODE_BIN, ETCD_NODE_ETCDUTL (etcd-node's binaries), ETCDCTL_BIN (etcd
// 3.6's etcdctl, which the framework runs), ROBUSTNESS_SEED (replays a run's choices: the
// scenarios' random options, the failpoints and the members they hit; the timing of a real
// cluster is not replayed), ROBUSTNESS_RUNS (how many scenarios, default 6; each is a traffic
// profile, a cluster shape and a fault), ROBUSTNESS_FAILPOINTS (a comma-separated subset of
// failpoint names), ROBUSTNESS_THREE_MEMBERS=1 (three regular members instead of two and a
// witness). TestRobustness runs the exploratory scenarios, TestRobustnessRegression the
// regression ones that need no gofail failpoint.
package robustness

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"golang.org/x/sync/errgroup"

	"go.etcd.io/etcd/server/v3/storage/wal"
	"go.etcd.io/etcd/tests/v3/framework/e2e"
	"go.etcd.io/etcd/tests/v3/robustness/client"
	"go.etcd.io/etcd/tests/v3/robustness/failpoint"
	"go.etcd.io/etcd/tests/v3/robustness/identity"
	"go.etcd.io/etcd/tests/v3/robustness/model"
	"go.etcd.io/etcd/tests/v3/robustness/report"
	"go.etcd.io/etcd/tests/v3/robustness/scenarios"
	"go.etcd.io/etcd/tests/v3/robustness/traffic"
	"go.etcd.io/etcd/tests/v3/robustness/validate"
	"go.etcd.io/raft/v3/raftpb"
)

var etcdutl string

func TestMain(m *testing.M) {
	node, ctl := os.Getenv("ETCD_NODE_BIN"), os.Getenv("ETCDCTL_BIN")
	etcdutl = os.Getenv("ETCD_NODE_ETCDUTL")
	if node == "" || ctl == "" || etcdutl == "" {
		fmt.Fprintln(os.Stderr, "set ETCD_NODE_BIN and ETCD_NODE_ETCDUTL (etcd-node's etcd-node and etcdutl) and ETCDCTL_BIN (etcd 3.6's etcdctl); scripts/test.sh does")
		os.Exit(2)
	}
	e2e.BinPath.Etcd = node
	e2e.BinPath.Etcdctl = ctl
	e2e.BinPath.Etcdutl = etcdutl
	// (no previous release and no lazyfs: the scenarios that need them are not offered)
	e2e.BinPath.EtcdLastRelease = "/nonexistent/etcd-last-release"
	e2e.BinPath.LazyFS = "/nonexistent/lazyfs"
	fixtures, err := moduleDir("go.etcd.io/etcd/tests/v3")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	// etcd's test certificates (localhost and 127.0.0.1), for the peer TLS the peer proxy needs.
	e2e.FixturesDir = filepath.Join(fixtures, "fixtures")
	e2e.CertDir = e2e.FixturesDir
	e2e.CertPath = filepath.Join(e2e.CertDir, "server.crt")
	e2e.PrivateKeyPath = filepath.Join(e2e.CertDir, "server.key.insecure")
	e2e.CaPath = filepath.Join(e2e.CertDir, "ca.crt")
	os.Exit(m.Run())
}

// moduleDir is where the Go tool keeps a module this one requires.
func moduleDir(module string) (string, error) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", module).Output()
	if err != nil {
		return "", fmt.Errorf("go list -m %s: %w", module, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// The suite's validation must carry the fix in backport/ (a history etcd-node gives it is
// otherwise called not linearizable): this does not build without it. scripts/test.sh builds
// with it; by hand, see backport/README.md.
var _ = validate.BackportedUniquePutReturnTimes

func seed(t *testing.T) int64 {
	s := time.Now().UnixNano() % 1_000_000
	if v := os.Getenv("ROBUSTNESS_SEED"); v != "" {
		var err error
		s, err = strconv.ParseInt(v, 10, 64)
		require.NoErrorf(t, err, "ROBUSTNESS_SEED=%q is not a number", v)
	}
	t.Logf("ROBUSTNESS_SEED=%d replays this run's choices", s)
	fmt.Printf("ROBUSTNESS_SEED=%d\n", s)
	//nolint:staticcheck // (the suite draws from the global source; randseednop=0 above)
	rand.Seed(s)
	return s
}

// The faults offered: the suite's own that need nothing compiled into the binary, and ours.
func failpoints(t *testing.T) []failpoint.Failpoint {
	all := []failpoint.Failpoint{
		failpoint.KillFailpoint,
		failpoint.BlackholePeerNetwork,
		failpoint.DelayPeerNetwork,
		failpoint.DropPeerNetwork,
		pauseFailpoint{duration: 3 * time.Second},
		witnessGoneFailpoint{},
		memberReplaceFailpoint{failpoint.MemberReplace},
	}
	names := os.Getenv("ROBUSTNESS_FAILPOINTS")
	if names == "" {
		return all
	}
	var chosen []failpoint.Failpoint
	for _, name := range strings.Split(names, ",") {
		found := false
		for _, f := range all {
			if f.Name() == name {
				chosen, found = append(chosen, f), true
			}
		}
		if !found {
			var known []string
			for _, f := range all {
				known = append(known, f.Name())
			}
			t.Fatalf("ROBUSTNESS_FAILPOINTS names %q; the failpoints are %s", name, strings.Join(known, ","))
		}
	}
	return chosen
}

func TestRobustness(t *testing.T) {
	seed(t)
	runs := 6
	if v := os.Getenv("ROBUSTNESS_RUNS"); v != "" {
		var err error
		runs, err = strconv.Atoi(v)
		require.NoErrorf(t, err, "ROBUSTNESS_RUNS=%q is not a number", v)
	}
	// The scenarios (traffic profile x cluster shape), those with a witness first, then one
	// member, alternating; round robin over them, a random fault each.
	var withWitness, single []scenarios.TestScenario
	for _, s := range scenarios.Exploratory(t) {
		if s.Cluster.ClusterSize == 3 {
			withWitness = append(withWitness, s)
		} else {
			single = append(single, s)
		}
	}
	var all []scenarios.TestScenario
	for i := range max(len(withWitness), len(single)) {
		if i < len(withWitness) {
			all = append(all, withWitness[i])
		}
		if i < len(single) {
			all = append(all, single[i])
		}
	}
	offered := failpoints(t)
	for i := 0; i < runs; i++ {
		s := all[i%len(all)]
		name := s.Name
		if os.Getenv("ROBUSTNESS_THREE_MEMBERS") != "1" {
			name = strings.ReplaceAll(name, "ClusterOfSize3", "TwoMembersAndWitness")
		}
		t.Run(fmt.Sprintf("%d/%s", i, name), func(t *testing.T) {
			ctx, lg, c := launch(t, &s)
			var available []failpoint.Failpoint
			for _, f := range offered {
				if failpoint.Validate(c, f, s.Profile) == nil {
					available = append(available, f)
				}
			}
			if len(available) == 0 {
				t.Skipf("none of the failpoints chosen applies to %s", s.Name)
			}
			s.Failpoint = available[rand.Intn(len(available))]
			t.Run(s.Failpoint.Name(), func(t *testing.T) {
				testRobustness(ctx, t, lg, s, c)
			})
		})
	}
}

// TestRobustnessRegression runs the suite's regression scenarios (each a fault that once
// found a bug in etcd) whose fault needs nothing compiled into the binary; the others are
// skipped, saying why.
func TestRobustnessRegression(t *testing.T) {
	seed(t)
	offered := failpoints(t)
	for _, s := range scenarios.Regression(t) {
		t.Run(s.Name, func(t *testing.T) {
			if !slices.ContainsFunc(offered, func(f failpoint.Failpoint) bool { return f.Name() == s.Failpoint.Name() }) {
				t.Skipf("its fault %s needs etcd's gofail failpoints compiled in", s.Failpoint.Name())
			}
			ctx, lg, c := launch(t, &s)
			if err := failpoint.Validate(c, s.Failpoint, s.Profile); err != nil {
				t.Skipf("its fault does not apply: %v", err)
			}
			testRobustness(ctx, t, lg, s, c)
		})
	}
}

// launch starts the scenario's cluster, logging to the test; the test's end kills it.
func launch(t *testing.T, s *scenarios.TestScenario) (context.Context, *zap.Logger, *e2e.EtcdProcessCluster) {
	lg := zaptest.NewLogger(t)
	s.Cluster.Logger = lg
	ctx := context.Background()
	c, err := startCluster(ctx, t, s.Cluster)
	require.NoError(t, err)
	t.Cleanup(func() { forceStop(c) })
	return ctx, lg, c
}

// startCluster starts the scenario's cluster from etcd-node processes through etcd's e2e
// framework. Three members become two and a witness (ROBUSTNESS_THREE_MEMBERS=1: three
// regular members, etcd-node's plain Raft).
func startCluster(ctx context.Context, t *testing.T, cfg e2e.EtcdProcessClusterConfig) (*e2e.EtcdProcessCluster, error) {
	// (etcd-node has failpoints of its own, not gofail's: the gofail faults are not offered)
	cfg.GoFailEnabled = false
	withWitness := cfg.ClusterSize == 3 && os.Getenv("ROBUSTNESS_THREE_MEMBERS") != "1"
	if withWitness {
		cfg.ClusterSize = 2
	}
	epc, err := e2e.InitEtcdProcessCluster(t, &cfg)
	if err != nil {
		return nil, err
	}
	if withWitness {
		dir := filepath.Join(t.TempDir(), "witness")
		if err := os.Mkdir(dir, 0o700); err != nil {
			return nil, err
		}
		peerURL := "witness:mount?path=" + url.QueryEscape(dir)
		out, err := exec.Command(etcdutl, "witness", "init", "--name", "witness", "--advertise-peer-url", peerURL).CombinedOutput()
		if err != nil {
			return nil, fmt.Errorf("etcdutl witness init: %w: %s", err, out)
		}
		witnessDirs.Store(epc, dir)
		for _, p := range epc.Procs {
			args := p.Config().Args
			for i, a := range args {
				if strings.HasPrefix(a, "--initial-cluster=") {
					args[i] = a + ",witness=" + peerURL
				}
			}
		}
	}
	return e2e.StartEtcdProcessCluster(ctx, t, epc, &cfg)
}

func forceStop(c *e2e.EtcdProcessCluster) {
	for _, member := range c.Procs {
		member.Kill()
	}
	c.ConcurrentStop()
}

// testRobustness is the suite's own sequence (robustness/main_test.go): traffic, a fault
// injected meanwhile, the watches, then validation of everything the clients saw against
// what the members persisted.
func testRobustness(ctx context.Context, t *testing.T, lg *zap.Logger, s scenarios.TestScenario, c *e2e.EtcdProcessCluster) {
	r := report.TestReport{Logger: lg, Cluster: c}
	panicked := true
	defer func() {
		// (the suite's drawing of a history can itself panic on some failed histories,
		// etcd-io/etcd#21863; that must not hide the failure above it or the saved report)
		defer func() {
			if p := recover(); p != nil {
				t.Errorf("drawing the history panicked (%v); the failure above and the report saved before it stand", p)
			}
		}()
		r.Report(t, panicked)
	}()
	r.Client = runScenario(ctx, t, s, lg, c)
	persisted, err := persistedRequests(t, lg, c)
	require.NoError(t, err)
	validateConfig := validate.Config{ExpectRevisionUnique: s.Traffic.ExpectUniqueRevision()}
	r.Visualize = validate.ValidateAndReturnVisualize(t, lg, validateConfig, r.Client, persisted, 5*time.Minute)
	t.Logf("validated %d persisted requests and the reports of %d clients", len(persisted), len(r.Client))
	panicked = false
}

// How long the traffic runs before and after the fault, as the suite's runner.
var (
	waitBeforeFailpoint = time.Second
	waitJitter          = traffic.DefaultCompactionPeriod
	waitAfterFailpoint  = time.Second
)

func runScenario(ctx context.Context, t *testing.T, s scenarios.TestScenario, lg *zap.Logger, clus *e2e.EtcdProcessCluster) []report.ClientReport {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	g := errgroup.Group{}
	var operationReport, watchReport, failpointClientReport []report.ClientReport
	failpointInjected := make(chan report.FailpointInjection, 1)
	baseTime := time.Now()
	ids := identity.NewIDProvider()
	g.Go(func() error {
		defer close(failpointInjected)
		time.Sleep(randomizeTime(waitBeforeFailpoint, waitJitter))
		fr, err := failpoint.Inject(ctx, t, lg, clus, s.Failpoint, baseTime, ids)
		if err != nil {
			t.Error(err)
			cancel()
		}
		time.Sleep(randomizeTime(waitAfterFailpoint, waitJitter))
		if fr != nil {
			failpointInjected <- fr.FailpointInjection
			failpointClientReport = fr.Client
		}
		return nil
	})
	maxRevisionChan := make(chan int64, 1)
	g.Go(func() error {
		defer close(maxRevisionChan)
		operationReport = traffic.SimulateTraffic(ctx, t, lg, clus, s.Profile, s.Traffic, failpointInjected, baseTime, ids)
		maxRevision := operationsMaxRevision(operationReport)
		maxRevisionChan <- maxRevision
		lg.Info("Finished simulating Traffic", zap.Int64("max-revision", maxRevision))
		return nil
	})
	g.Go(func() error {
		watchReport = client.CollectClusterWatchEvents(ctx, t, clus, maxRevisionChan, s.Watch, baseTime, ids)
		return nil
	})
	g.Wait()
	return append(operationReport, append(failpointClientReport, watchReport...)...)
}

func randomizeTime(base time.Duration, jitter time.Duration) time.Duration {
	return base - jitter + time.Duration(rand.Int63n(int64(jitter)*2))
}

func operationsMaxRevision(reports []report.ClientReport) int64 {
	var maxRevision int64
	for _, r := range reports {
		for _, op := range r.KeyValue {
			resp := op.Output.(model.MaybeEtcdResponse)
			maxRevision = max(maxRevision, resp.Revision)
		}
	}
	return maxRevision
}

// persistedRequests gives the suite's reader what each member persisted: `etcdutl wal dump`
// of the member's data directory, written into an etcd WAL of its own (each entry's data is
// etcd's encoding of the request). A member whose log does not run from the cluster's start (a
// later snapshot replaced its beginning) gets an empty directory, which the reader counts as a
// member it could not read (it allows that for a minority, as for etcd).
func persistedRequests(t *testing.T, lg *zap.Logger, c *e2e.EtcdProcessCluster) ([]model.EtcdRequest, error) {
	var dirs []string
	for _, p := range c.Procs {
		dir := t.TempDir()
		if err := etcdWAL(lg, p.Config().DataDirPath, dir); err != nil {
			lg.Info("no etcd WAL from this member's log", zap.String("member", p.Config().Name), zap.Error(err))
		}
		dirs = append(dirs, dir)
	}
	return report.PersistedRequestsDirs(lg, dirs)
}

type dumpHead struct {
	FromFirstSnapshot *struct {
		Index uint64 `json:"index"`
		Term  uint64 `json:"term"`
	} `json:"from_first_snapshot"`
	HardState struct {
		Term   uint64 `json:"term"`
		Vote   string `json:"vote"`
		Commit uint64 `json:"commit"`
	} `json:"hard_state"`
}

type dumpEntry struct {
	Index    uint64 `json:"index"`
	Term     uint64 `json:"term"`
	Type     string `json:"type"`
	EtcdData []byte `json:"etcd_data"`
}

func etcdWAL(lg *zap.Logger, dataDir, into string) error {
	out, err := exec.Command(etcdutl, "wal", "dump", "--data-dir", dataDir).Output()
	if err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return fmt.Errorf("etcdutl wal dump: %w: %s", err, exit.Stderr)
		}
		return err
	}
	lines := bufio.NewScanner(bytes.NewReader(out))
	lines.Buffer(nil, 64<<20)
	if !lines.Scan() {
		return fmt.Errorf("etcdutl wal dump printed nothing")
	}
	var head dumpHead
	if err := json.Unmarshal(lines.Bytes(), &head); err != nil {
		return fmt.Errorf("the dump's first line: %w", err)
	}
	var ents []raftpb.Entry
	// A new cluster's members begin from a snapshot at index 1 that holds the membership only
	// (etcd logs the same as configuration changes, which its reader skips): when the log runs
	// on from it, it is the whole history.
	if start := head.FromFirstSnapshot; start != nil && start.Index == 1 {
		ents = append(ents, raftpb.Entry{Index: 1, Term: start.Term, Type: raftpb.EntryConfChange})
	}
	for lines.Scan() {
		var e dumpEntry
		if err := json.Unmarshal(lines.Bytes(), &e); err != nil {
			return fmt.Errorf("a dump line: %w", err)
		}
		entryType := raftpb.EntryNormal
		if e.Type == "conf-change" {
			entryType = raftpb.EntryConfChange
		}
		ents = append(ents, raftpb.Entry{Index: e.Index, Term: e.Term, Type: entryType, Data: e.EtcdData})
	}
	if err := lines.Err(); err != nil {
		return err
	}
	if len(ents) == 0 || ents[0].Index != 1 {
		return fmt.Errorf("the log does not start at index 1")
	}
	vote, err := strconv.ParseUint(head.HardState.Vote, 16, 64)
	if err != nil {
		return fmt.Errorf("the dump's vote %q: %w", head.HardState.Vote, err)
	}
	w, err := wal.Create(lg, filepath.Join(into, "member", "wal"), nil)
	if err != nil {
		return err
	}
	defer w.Close()
	hs := raftpb.HardState{Term: head.HardState.Term, Vote: vote, Commit: min(head.HardState.Commit, ents[len(ents)-1].Index)}
	return w.Save(hs, ents)
}

// pauseFailpoint stops a random member with SIGSTOP for a while, then lets it go on: a
// leader that does not know it was paused must not act on what it believed before.
type pauseFailpoint struct{ duration time.Duration }

func (f pauseFailpoint) Inject(ctx context.Context, t *testing.T, lg *zap.Logger, clus *e2e.EtcdProcessCluster, baseTime time.Time, ids identity.Provider) ([]report.ClientReport, error) {
	member := clus.Procs[rand.Intn(len(clus.Procs))]
	if err := member.Pause(); err != nil {
		return nil, err
	}
	time.Sleep(f.duration)
	return nil, member.Resume()
}

func (f pauseFailpoint) Name() string { return "PauseMember" }

func (f pauseFailpoint) Available(e2e.EtcdProcessClusterConfig, e2e.EtcdProcess, traffic.Profile) bool {
	return true
}

// witnessDirs maps a cluster with a witness to the witness's directory.
var witnessDirs sync.Map

// witnessGoneFailpoint takes the witness's storage away (its directory renamed), kills a
// random member, starts it again after a while and then brings the storage back: without the
// witness one member is not a majority, so writes must stop (not be lost) until both members
// are back.
type witnessGoneFailpoint struct{}

func (f witnessGoneFailpoint) Inject(ctx context.Context, t *testing.T, lg *zap.Logger, clus *e2e.EtcdProcessCluster, baseTime time.Time, ids identity.Provider) ([]report.ClientReport, error) {
	v, ok := witnessDirs.Load(clus)
	if !ok {
		return nil, fmt.Errorf("this cluster has no witness")
	}
	dir := v.(string)
	away := dir + ".away"
	if err := os.Rename(dir, away); err != nil {
		return nil, err
	}
	member := clus.Procs[rand.Intn(len(clus.Procs))]
	if err := member.Kill(); err != nil {
		return nil, err
	}
	if err := member.Wait(ctx); err != nil {
		return nil, err
	}
	time.Sleep(2 * time.Second)
	if err := member.Start(ctx); err != nil {
		return nil, err
	}
	return nil, os.Rename(away, dir)
}

func (f witnessGoneFailpoint) Name() string { return "WitnessGoneAndKill" }

func (f witnessGoneFailpoint) Available(config e2e.EtcdProcessClusterConfig, _ e2e.EtcdProcess, _ traffic.Profile) bool {
	return config.ClusterSize == 2
}

// memberReplaceFailpoint is the suite's MemberReplace (a member removed, its data wiped, added
// back and started with --initial-cluster-state=existing), offered only with three regular
// members: a cluster of two members and a witness refuses the removal by design (the witness
// needs two regular voters beside it; docs/operations.md replaces a member by adding the new
// one first).
type memberReplaceFailpoint struct{ failpoint.Failpoint }

func (f memberReplaceFailpoint) Available(config e2e.EtcdProcessClusterConfig, member e2e.EtcdProcess, profile traffic.Profile) bool {
	return config.ClusterSize >= 3 && f.Failpoint.Available(config, member, profile)
}
