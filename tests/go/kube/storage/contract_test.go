package storage

import (
	"context"
	"fmt"
	"testing"

	"k8s.io/apiserver/pkg/features"
	storagetesting "k8s.io/apiserver/pkg/storage/testing"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	featuregatetesting "k8s.io/component-base/featuregate/testing"
)

// contract is one test of the contract, with the arguments etcd's copy (store_test.go and
// watcher_test.go of k8s.io/apiserver/pkg/storage/etcd3) gives it against an etcd.
type contract struct {
	name string
	run  func(ctx context.Context, t *testing.T, s *testStore)
	// compacts: on a cluster of its own (newCompactingStore).
	compacts bool
	// rangeStream: run with Kubernetes' EtcdRangeStream on (its default since 1.37: lists
	// try etcd 3.7's RangeStream and fall back to paged ranges on etcd-node) and off.
	rangeStream bool
}

var contracts = []contract{
	{name: "Create", run: func(ctx context.Context, t *testing.T, s *testStore) {
		storagetesting.RunTestCreate(ctx, t, s, s.stored())
	}},
	{name: "CreateWithTTL", run: func(ctx context.Context, t *testing.T, s *testStore) {
		storagetesting.RunTestCreateWithTTL(ctx, t, s)
	}},
	{name: "CreateWithKeyExist", run: func(ctx context.Context, t *testing.T, s *testStore) {
		storagetesting.RunTestCreateWithKeyExist(ctx, t, s)
	}},
	{name: "Get", run: func(ctx context.Context, t *testing.T, s *testStore) {
		storagetesting.RunTestGet(ctx, t, s)
	}},
	{name: "UnconditionalDelete", run: func(ctx context.Context, t *testing.T, s *testStore) {
		storagetesting.RunTestUnconditionalDelete(ctx, t, s)
	}},
	{name: "ConditionalDelete", run: func(ctx context.Context, t *testing.T, s *testStore) {
		storagetesting.RunTestConditionalDelete(ctx, t, s)
	}},
	{name: "DeleteWithSuggestion", run: func(ctx context.Context, t *testing.T, s *testStore) {
		storagetesting.RunTestDeleteWithSuggestion(ctx, t, s)
	}},
	{name: "DeleteWithSuggestionAndConflict", run: func(ctx context.Context, t *testing.T, s *testStore) {
		storagetesting.RunTestDeleteWithSuggestionAndConflict(ctx, t, s)
	}},
	{name: "DeleteWithSuggestionOfDeletedObject", run: func(ctx context.Context, t *testing.T, s *testStore) {
		storagetesting.RunTestDeleteWithSuggestionOfDeletedObject(ctx, t, s)
	}},
	{name: "ValidateDeletionWithSuggestion", run: func(ctx context.Context, t *testing.T, s *testStore) {
		storagetesting.RunTestValidateDeletionWithSuggestion(ctx, t, s)
	}},
	{name: "ValidateDeletionWithOnlySuggestionValid", run: func(ctx context.Context, t *testing.T, s *testStore) {
		storagetesting.RunTestValidateDeletionWithOnlySuggestionValid(ctx, t, s)
	}},
	{name: "DeleteWithConflict", run: func(ctx context.Context, t *testing.T, s *testStore) {
		storagetesting.RunTestDeleteWithConflict(ctx, t, s)
	}},
	{name: "PreconditionalDeleteWithSuggestion", run: func(ctx context.Context, t *testing.T, s *testStore) {
		storagetesting.RunTestPreconditionalDeleteWithSuggestion(ctx, t, s)
	}},
	{name: "PreconditionalDeleteWithOnlySuggestionPass", run: func(ctx context.Context, t *testing.T, s *testStore) {
		storagetesting.RunTestPreconditionalDeleteWithOnlySuggestionPass(ctx, t, s)
	}},
	{name: "GuaranteedUpdate", run: func(ctx context.Context, t *testing.T, s *testStore) {
		storagetesting.RunTestGuaranteedUpdate(ctx, t, s, s.stored())
	}},
	{name: "GuaranteedUpdateWithTTL", run: func(ctx context.Context, t *testing.T, s *testStore) {
		storagetesting.RunTestGuaranteedUpdateWithTTL(ctx, t, s)
	}},
	{name: "GuaranteedUpdateChecksStoredData", run: func(ctx context.Context, t *testing.T, s *testStore) {
		storagetesting.RunTestGuaranteedUpdateChecksStoredData(ctx, t, s)
	}},
	{name: "GuaranteedUpdateWithConflict", run: func(ctx context.Context, t *testing.T, s *testStore) {
		storagetesting.RunTestGuaranteedUpdateWithConflict(ctx, t, s)
	}},
	{name: "GuaranteedUpdateWithSuggestionAndConflict", run: func(ctx context.Context, t *testing.T, s *testStore) {
		storagetesting.RunTestGuaranteedUpdateWithSuggestionAndConflict(ctx, t, s)
	}},
	{name: "TransformationFailure", run: func(ctx context.Context, t *testing.T, s *testStore) {
		storagetesting.RunTestTransformationFailure(ctx, t, s)
	}},
	{name: "List", compacts: true, rangeStream: true, run: func(ctx context.Context, t *testing.T, s *testStore) {
		storagetesting.RunTestList(ctx, t, s, s.compaction(), false, s.recorder)
	}},
	{name: "ListPaging", run: func(ctx context.Context, t *testing.T, s *testStore) {
		storagetesting.RunTestListPaging(ctx, t, s)
	}},
	{name: "GetListNonRecursive", run: func(ctx context.Context, t *testing.T, s *testStore) {
		storagetesting.RunTestGetListNonRecursive(ctx, t, s.increaseRV(), s)
	}},
	{name: "GetListRecursivePrefix", run: func(ctx context.Context, t *testing.T, s *testStore) {
		storagetesting.RunTestGetListRecursivePrefix(ctx, t, s)
	}},
	{name: "KeySchema", run: func(ctx context.Context, t *testing.T, s *testStore) {
		storagetesting.RunTestKeySchema(ctx, t, s)
	}},
	{name: "ConsistentList", rangeStream: true, run: func(ctx context.Context, t *testing.T, s *testStore) {
		storagetesting.RunTestConsistentList(ctx, t, s, s.increaseRV(), false, true, false)
	}},
	{name: "CompactRevision", compacts: true, run: func(ctx context.Context, t *testing.T, s *testStore) {
		storagetesting.RunTestCompactRevision(ctx, t, s, s.increaseRV(), s.compaction())
	}},
	{name: "ListInconsistentContinuation", compacts: true, run: func(ctx context.Context, t *testing.T, s *testStore) {
		storagetesting.RunTestListInconsistentContinuation(ctx, t, s, s.compaction())
	}},
	{name: "ListResourceVersionMatch", run: func(ctx context.Context, t *testing.T, s *testStore) {
		storagetesting.RunTestListResourceVersionMatch(ctx, t, s)
	}},
	{name: "NamespaceScopedList", run: func(ctx context.Context, t *testing.T, s *testStore) {
		storagetesting.RunTestNamespaceScopedList(ctx, t, s)
	}},
	{name: "Watch", run: func(ctx context.Context, t *testing.T, s *testStore) {
		storagetesting.RunTestWatch(ctx, t, s)
	}},
	{name: "ClusterScopedWatch", run: func(ctx context.Context, t *testing.T, s *testStore) {
		storagetesting.RunTestClusterScopedWatch(ctx, t, s)
	}},
	{name: "NamespaceScopedWatch", run: func(ctx context.Context, t *testing.T, s *testStore) {
		storagetesting.RunTestNamespaceScopedWatch(ctx, t, s)
	}},
	{name: "DeleteTriggerWatch", run: func(ctx context.Context, t *testing.T, s *testStore) {
		storagetesting.RunTestDeleteTriggerWatch(ctx, t, s)
	}},
	{name: "WatchFromZero", compacts: true, run: func(ctx context.Context, t *testing.T, s *testStore) {
		storagetesting.RunTestWatchFromZero(ctx, t, s, s.compaction())
	}},
	{name: "WatchFromNonZero", run: func(ctx context.Context, t *testing.T, s *testStore) {
		storagetesting.RunTestWatchFromNonZero(ctx, t, s)
	}},
	{name: "DelayedWatchDelivery", run: func(ctx context.Context, t *testing.T, s *testStore) {
		storagetesting.RunTestDelayedWatchDelivery(ctx, t, s)
	}},
	{name: "WatchError", run: func(ctx context.Context, t *testing.T, s *testStore) {
		storagetesting.RunTestWatchError(ctx, t, s)
	}},
	{name: "WatchContextCancel", run: func(ctx context.Context, t *testing.T, s *testStore) {
		storagetesting.RunTestWatchContextCancel(ctx, t, s)
	}},
	{name: "WatcherTimeout", run: func(ctx context.Context, t *testing.T, s *testStore) {
		storagetesting.RunTestWatcherTimeout(ctx, t, s)
	}},
	{name: "WatchDeleteEventObjectHaveLatestRV", run: func(ctx context.Context, t *testing.T, s *testStore) {
		storagetesting.RunTestWatchDeleteEventObjectHaveLatestRV(ctx, t, s)
	}},
	{name: "WatchInitializationSignal", run: func(ctx context.Context, t *testing.T, s *testStore) {
		storagetesting.RunTestWatchInitializationSignal(ctx, t, s)
	}},
	{name: "ProgressNotify", run: func(ctx context.Context, t *testing.T, s *testStore) {
		storagetesting.RunOptionalTestProgressNotify(ctx, t, s, s.increaseRV())
	}},
	{name: "WatchDispatchBookmarkEvents", run: func(ctx context.Context, t *testing.T, s *testStore) {
		storagetesting.RunTestWatchDispatchBookmarkEvents(ctx, t, s, false)
	}},
	{name: "SendInitialEventsBackwardCompatibility", run: func(ctx context.Context, t *testing.T, s *testStore) {
		storagetesting.RunSendInitialEventsBackwardCompatibility(ctx, t, s)
	}},
	{name: "WatchErrorEventIsBlockingFurtherEvent", run: func(ctx context.Context, t *testing.T, s *testStore) {
		storagetesting.RunWatchErrorIsBlockingFurtherEvents(ctx, t, s)
	}},
	{name: "WatchSemantics", rangeStream: true, run: func(ctx context.Context, t *testing.T, s *testStore) {
		storagetesting.RunWatchSemantics(ctx, t, s)
	}},
	{name: "WatchSemanticInitialEventsExtended", rangeStream: true, run: func(ctx context.Context, t *testing.T, s *testStore) {
		storagetesting.RunWatchSemanticInitialEventsExtended(ctx, t, s)
	}},
	{name: "WatchListMatchSingle", rangeStream: true, run: func(ctx context.Context, t *testing.T, s *testStore) {
		storagetesting.RunWatchListMatchSingle(ctx, t, s)
	}},
}

func TestContract(t *testing.T) {
	for _, c := range contracts {
		t.Run(c.name, func(t *testing.T) {
			// (the store follows compactions through its watch of the compaction key, which only
			// ListFromCacheSnapshot turns on; etcd's copy turns it on for CompactRevision)
			if c.name == "CompactRevision" {
				featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.ListFromCacheSnapshot, true)
			}
			variants := []bool{false}
			if c.rangeStream {
				variants = []bool{true, false}
			}
			for _, on := range variants {
				t.Run(fmt.Sprintf("rangeStream=%v", on), func(t *testing.T) {
					featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.EtcdRangeStream, on)
					store := newStore
					if c.compacts {
						store = newCompactingStore
					}
					ctx, s := store(t)
					c.run(ctx, t, s)
				})
			}
		})
	}
}
