package storage

import (
	"fmt"
	"testing"

	"k8s.io/apiserver/pkg/features"
	storagetesting "k8s.io/apiserver/pkg/storage/testing"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	featuregatetesting "k8s.io/component-base/featuregate/testing"
)

// The contract, in the order and with the arguments etcd's copy (store_test.go and
// watcher_test.go of k8s.io/apiserver/pkg/storage/etcd3) runs it against an etcd.

func TestCreate(t *testing.T) {
	ctx, s := newStore(t)
	storagetesting.RunTestCreate(ctx, t, s, s.stored())
}

func TestCreateWithTTL(t *testing.T) {
	ctx, s := newStore(t)
	storagetesting.RunTestCreateWithTTL(ctx, t, s)
}

func TestCreateWithKeyExist(t *testing.T) {
	ctx, s := newStore(t)
	storagetesting.RunTestCreateWithKeyExist(ctx, t, s)
}

func TestGet(t *testing.T) {
	ctx, s := newStore(t)
	storagetesting.RunTestGet(ctx, t, s)
}

func TestDelete(t *testing.T) {
	for name, run := range map[string]func(*testing.T, *testStore){
		"Unconditional": func(t *testing.T, s *testStore) {
			storagetesting.RunTestUnconditionalDelete(t.Context(), t, s)
		},
		"Conditional": func(t *testing.T, s *testStore) {
			storagetesting.RunTestConditionalDelete(t.Context(), t, s)
		},
		"WithSuggestion": func(t *testing.T, s *testStore) {
			storagetesting.RunTestDeleteWithSuggestion(t.Context(), t, s)
		},
		"WithSuggestionAndConflict": func(t *testing.T, s *testStore) {
			storagetesting.RunTestDeleteWithSuggestionAndConflict(t.Context(), t, s)
		},
		"WithSuggestionOfDeletedObject": func(t *testing.T, s *testStore) {
			storagetesting.RunTestDeleteWithSuggestionOfDeletedObject(t.Context(), t, s)
		},
		"ValidateDeletionWithSuggestion": func(t *testing.T, s *testStore) {
			storagetesting.RunTestValidateDeletionWithSuggestion(t.Context(), t, s)
		},
		"ValidateDeletionWithOnlySuggestionValid": func(t *testing.T, s *testStore) {
			storagetesting.RunTestValidateDeletionWithOnlySuggestionValid(t.Context(), t, s)
		},
		"WithConflict": func(t *testing.T, s *testStore) {
			storagetesting.RunTestDeleteWithConflict(t.Context(), t, s)
		},
		"PreconditionalWithSuggestion": func(t *testing.T, s *testStore) {
			storagetesting.RunTestPreconditionalDeleteWithSuggestion(t.Context(), t, s)
		},
		"PreconditionalWithOnlySuggestionPass": func(t *testing.T, s *testStore) {
			storagetesting.RunTestPreconditionalDeleteWithOnlySuggestionPass(t.Context(), t, s)
		},
	} {
		t.Run(name, func(t *testing.T) {
			_, s := newStore(t)
			run(t, s)
		})
	}
}

func TestGuaranteedUpdate(t *testing.T) {
	ctx, s := newStore(t)
	storagetesting.RunTestGuaranteedUpdate(ctx, t, s, s.stored())
}

func TestGuaranteedUpdateWithTTL(t *testing.T) {
	ctx, s := newStore(t)
	storagetesting.RunTestGuaranteedUpdateWithTTL(ctx, t, s)
}

func TestGuaranteedUpdateChecksStoredData(t *testing.T) {
	ctx, s := newStore(t)
	storagetesting.RunTestGuaranteedUpdateChecksStoredData(ctx, t, s)
}

func TestGuaranteedUpdateWithConflict(t *testing.T) {
	ctx, s := newStore(t)
	storagetesting.RunTestGuaranteedUpdateWithConflict(ctx, t, s)
}

func TestGuaranteedUpdateWithSuggestionAndConflict(t *testing.T) {
	ctx, s := newStore(t)
	storagetesting.RunTestGuaranteedUpdateWithSuggestionAndConflict(ctx, t, s)
}

func TestTransformationFailure(t *testing.T) {
	ctx, s := newStore(t)
	storagetesting.RunTestTransformationFailure(ctx, t, s)
}

// rangeStream runs test with Kubernetes' EtcdRangeStream on (its default since 1.37: lists
// try etcd 3.7's RangeStream, and fall back to paginated ranges where it is unimplemented, as
// on etcd-node) and off.
func rangeStream(t *testing.T, test func(t *testing.T)) {
	for _, on := range []bool{true, false} {
		t.Run(fmt.Sprintf("rangeStream=%v", on), func(t *testing.T) {
			featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.EtcdRangeStream, on)
			test(t)
		})
	}
}

func TestList(t *testing.T) {
	rangeStream(t, func(t *testing.T) {
		ctx, s := newCompactingStore(t)
		storagetesting.RunTestList(ctx, t, s, s.compaction(), false, s.recorder)
	})
}

func TestListPaging(t *testing.T) {
	ctx, s := newStore(t)
	storagetesting.RunTestListPaging(ctx, t, s)
}

func TestGetListNonRecursive(t *testing.T) {
	ctx, s := newStore(t)
	storagetesting.RunTestGetListNonRecursive(ctx, t, s.increaseRV(), s)
}

func TestGetListRecursivePrefix(t *testing.T) {
	ctx, s := newStore(t)
	storagetesting.RunTestGetListRecursivePrefix(ctx, t, s)
}

func TestKeySchema(t *testing.T) {
	ctx, s := newStore(t)
	storagetesting.RunTestKeySchema(ctx, t, s)
}

func TestConsistentList(t *testing.T) {
	rangeStream(t, func(t *testing.T) {
		ctx, s := newStore(t)
		storagetesting.RunTestConsistentList(ctx, t, s, s.increaseRV(), false, true, false)
	})
}

func TestCompactRevision(t *testing.T) {
	// (the store follows the compaction through its watch of the compaction key, which only
	// ListFromCacheSnapshot turns on; etcd's copy sets it the same way)
	featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.ListFromCacheSnapshot, true)
	ctx, s := newCompactingStore(t)
	storagetesting.RunTestCompactRevision(ctx, t, s, s.increaseRV(), s.compaction())
}

func TestListInconsistentContinuation(t *testing.T) {
	ctx, s := newCompactingStore(t)
	storagetesting.RunTestListInconsistentContinuation(ctx, t, s, s.compaction())
}

func TestListResourceVersionMatch(t *testing.T) {
	ctx, s := newStore(t)
	storagetesting.RunTestListResourceVersionMatch(ctx, t, s)
}

func TestNamespaceScopedList(t *testing.T) {
	ctx, s := newStore(t)
	storagetesting.RunTestNamespaceScopedList(ctx, t, s)
}

func TestWatch(t *testing.T) {
	for name, run := range map[string]func(*testing.T, *testStore){
		"Watch": func(t *testing.T, s *testStore) { storagetesting.RunTestWatch(t.Context(), t, s) },
		"ClusterScopedWatch": func(t *testing.T, s *testStore) {
			storagetesting.RunTestClusterScopedWatch(t.Context(), t, s)
		},
		"NamespaceScopedWatch": func(t *testing.T, s *testStore) {
			storagetesting.RunTestNamespaceScopedWatch(t.Context(), t, s)
		},
		"DeleteTriggerWatch": func(t *testing.T, s *testStore) {
			storagetesting.RunTestDeleteTriggerWatch(t.Context(), t, s)
		},
		"WatchFromNonZero": func(t *testing.T, s *testStore) {
			storagetesting.RunTestWatchFromNonZero(t.Context(), t, s)
		},
		"DelayedWatchDelivery": func(t *testing.T, s *testStore) {
			storagetesting.RunTestDelayedWatchDelivery(t.Context(), t, s)
		},
		"WatchError": func(t *testing.T, s *testStore) {
			storagetesting.RunTestWatchError(t.Context(), t, s)
		},
		"WatchContextCancel": func(t *testing.T, s *testStore) {
			storagetesting.RunTestWatchContextCancel(t.Context(), t, s)
		},
		"WatcherTimeout": func(t *testing.T, s *testStore) {
			storagetesting.RunTestWatcherTimeout(t.Context(), t, s)
		},
		"WatchDeleteEventObjectHaveLatestRV": func(t *testing.T, s *testStore) {
			storagetesting.RunTestWatchDeleteEventObjectHaveLatestRV(t.Context(), t, s)
		},
		"WatchInitializationSignal": func(t *testing.T, s *testStore) {
			storagetesting.RunTestWatchInitializationSignal(t.Context(), t, s)
		},
		"ProgressNotify": func(t *testing.T, s *testStore) {
			storagetesting.RunOptionalTestProgressNotify(t.Context(), t, s, s.increaseRV())
		},
		"WatchDispatchBookmarkEvents": func(t *testing.T, s *testStore) {
			storagetesting.RunTestWatchDispatchBookmarkEvents(t.Context(), t, s, false)
		},
		"SendInitialEventsBackwardCompatibility": func(t *testing.T, s *testStore) {
			storagetesting.RunSendInitialEventsBackwardCompatibility(t.Context(), t, s)
		},
		"WatchErrorEventIsBlockingFurtherEvent": func(t *testing.T, s *testStore) {
			storagetesting.RunWatchErrorIsBlockingFurtherEvents(t.Context(), t, s)
		},
	} {
		t.Run(name, func(t *testing.T) {
			_, s := newStore(t)
			run(t, s)
		})
	}
	t.Run("WatchFromZero", func(t *testing.T) {
		ctx, s := newCompactingStore(t)
		storagetesting.RunTestWatchFromZero(ctx, t, s, s.compaction())
	})
	rangeStream(t, func(t *testing.T) {
		for name, run := range map[string]func(*testing.T, *testStore){
			"WatchSemantics": func(t *testing.T, s *testStore) {
				storagetesting.RunWatchSemantics(t.Context(), t, s)
			},
			"WatchSemanticInitialEventsExtended": func(t *testing.T, s *testStore) {
				storagetesting.RunWatchSemanticInitialEventsExtended(t.Context(), t, s)
			},
			"WatchListMatchSingle": func(t *testing.T, s *testStore) {
				storagetesting.RunWatchListMatchSingle(t.Context(), t, s)
			},
		} {
			t.Run(name, func(t *testing.T) {
				_, s := newStore(t)
				run(t, s)
			})
		}
	})
}
