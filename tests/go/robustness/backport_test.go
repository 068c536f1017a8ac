package robustness

import (
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"go.etcd.io/etcd/tests/v3/robustness/model"
	"go.etcd.io/etcd/tests/v3/robustness/report"
	"go.etcd.io/etcd/tests/v3/robustness/validate"
	"go.uber.org/zap/zaptest"
)

// The suite's validation with the backport the test script applies (backport/README.md): a
// history that etcd-node gave the suite, cut to its four requests, which etcd 3.6.16's
// validation calls not linearizable. Kubernetes' compaction loop sends the same conditional
// put twice (its first try was answered by a killed member, so it tries again); both are in
// the log, the first applied, the second failing its condition. The unanswered put between
// them, sent after a watch saw the first, was given the watch's time as its latest possible
// return: before it was sent. etcd's validation since 3.7 leaves a put sent more than once
// out of those times; without the backport this test fails.
func TestRobustnessValidatesAPutSentTwice(t *testing.T) {
	put := func(key, value string, conditions ...model.EtcdCondition) model.EtcdRequest {
		txn := &model.TxnRequest{
			Conditions:          conditions,
			OperationsOnSuccess: []model.EtcdOperation{{Type: model.PutOperation, Put: model.PutOptions{Key: key, Value: model.ToValueOrHash(value)}}},
			OperationsOnFailure: []model.EtcdOperation{},
		}
		if len(conditions) > 0 {
			txn.OperationsOnFailure = []model.EtcdOperation{{Type: model.RangeOperation, Range: model.RangeOptions{Start: key}}}
		}
		return model.EtcdRequest{Type: model.Txn, Txn: txn}
	}
	answered := func(revision int64, failure bool, results ...model.EtcdOperationResult) model.MaybeEtcdResponse {
		if results == nil {
			results = []model.EtcdOperationResult{{}}
		}
		return model.MaybeEtcdResponse{EtcdResponse: model.EtcdResponse{Revision: revision, Txn: &model.TxnResponse{Failure: failure, Results: results}}}
	}
	unknown := model.MaybeEtcdResponse{Error: "rpc error: code = Unavailable desc = error reading from server: EOF"}
	ms := func(n int64) int64 { return (time.Duration(n) * time.Millisecond).Nanoseconds() }
	first := put("k", "a")
	compact := put("compact_rev_key", "0", model.EtcdCondition{Key: "compact_rev_key", ExpectedVersion: 0})
	between := put("k", "b")
	op := func(client int, in model.EtcdRequest, call, ret int64, out model.MaybeEtcdResponse) report.ClientReport {
		return report.ClientReport{ClientID: client, KeyValue: []porcupine.Operation{{ClientId: client, Input: in, Call: ms(call), Output: out, Return: ms(ret)}}}
	}
	compacted := model.EtcdOperationResult{RangeResponse: model.RangeResponse{Count: 1, KVs: []model.KeyValue{{Key: "compact_rev_key", ValueRevision: model.ValueRevision{Value: model.ToValueOrHash("0"), ModRevision: 3, Version: 1}}}}}
	reports := []report.ClientReport{
		op(1, first, 1, 5, answered(2, false)),
		// (an unanswered write's return is the end of the history and a second, as the suite's)
		op(2, compact, 10, 1050, unknown),
		op(3, between, 30, 1050, unknown),
		op(4, compact, 40, 50, answered(4, true, compacted)),
		{ClientID: 5, Watch: []model.WatchOperation{{
			Request: model.WatchRequest{Key: "compact_rev_key", Revision: 1},
			Responses: []model.WatchResponse{{Time: 20 * time.Millisecond, Revision: 3, Events: []model.WatchEvent{{
				PersistedEvent: model.PersistedEvent{Event: model.Event{Type: model.PutOperation, Key: "compact_rev_key", Value: model.ToValueOrHash("0")}, Revision: 3, IsCreate: true},
			}}}},
		}}},
	}
	persisted := []model.EtcdRequest{first, compact, between, compact}
	validate.ValidateAndReturnVisualize(t, zaptest.NewLogger(t), validate.Config{}, reports, persisted, time.Minute)
}
