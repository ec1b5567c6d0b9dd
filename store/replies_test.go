package store_test

import (
	"errors"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/hearth-dev/hearth/store"
)

func cmd(v any) *redis.Cmd { return redis.NewCmdResult(v, nil) }

func TestScriptReply(t *testing.T) {
	if code, _, repaired, err := store.ScriptReply(cmd(int64(1))); err != nil || code != 1 || repaired {
		t.Errorf("plain code: %d, %v, %v", code, repaired, err)
	}
	if code, found, repaired, err := store.ScriptReply(cmd([]any{int64(0), "nan"})); err != nil || code != 0 || found != "nan" || !repaired {
		t.Errorf("code with a repair: %d, %q, %v, %v", code, found, repaired, err)
	}
	for _, v := range []any{"1", []any{int64(1)}, []any{"1", "x"}, []any{int64(1), int64(2)}} {
		if _, _, _, err := store.ScriptReply(cmd(v)); err == nil {
			t.Errorf("reply %#v accepted", v)
		}
	}
	if _, _, _, err := store.ScriptReply(redis.NewCmdResult(nil, errors.New("NOSCRIPT"))); err == nil {
		t.Error("an error reply accepted")
	}
}

func TestVersionedReplies(t *testing.T) {
	r, fence, err := store.VersionedReply(cmd([]any{int64(store.CodeUnbacked), "f", "r", "value_absent", "rec"}))
	if err != nil || fence != "f" || r != (store.KeyReply{Code: store.CodeUnbacked, Record: "r", Why: "value_absent", Detail: "rec"}) {
		t.Errorf("VersionedReply = %+v, %q, %v", r, fence, err)
	}
	for _, v := range []any{
		[]any{int64(5), "", "", "", ""}, // 5 is the pre-warm's only
		[]any{int64(-1), "", "", "", ""},
		[]any{int64(1), "", "", ""},
		[]any{"1", "", "", "", ""},
	} {
		if _, _, err := store.VersionedReply(cmd(v)); err == nil {
			t.Errorf("VersionedReply(%#v) accepted", v)
		}
	}
	// Only the keys with something to say carry more than their code.
	rs, fence, err := store.VersionedManyReply(cmd([]any{int64(1), "", "132", int64(2), "x", "record_malformed", ""}), 3)
	if err != nil || fence != "" || len(rs) != 3 || rs[0] != (store.KeyReply{Code: store.CodeWritten}) ||
		rs[1] != (store.KeyReply{Code: store.CodeOlder, Record: "x", Why: "record_malformed"}) || rs[2] != (store.KeyReply{Code: store.CodeExtended}) {
		t.Errorf("VersionedManyReply = %+v, %q, %v", rs, fence, err)
	}
	if rs, fence, err := store.VersionedManyReply(cmd([]any{int64(0), "nan"}), 3); err != nil || rs != nil || fence != "nan" {
		t.Errorf("fenced VersionedManyReply = %+v, %q, %v", rs, fence, err)
	}
	for _, v := range []any{
		[]any{int64(1), "", "1"},                                               // one key short
		[]any{int64(1), "", "01"},                                              // fenced inside a passed chunk
		[]any{int64(1), "", "15"},                                              // the pre-warm's code
		[]any{int64(1), "", "11", int64(3), "", "", "x"},                       // details of a third key
		[]any{int64(1), "", "11", int64(1), "", ""},                            // details cut short
		[]any{int64(1), "", "11", int64(2), "", "", "", int64(1), "", "", "x"}, // out of order
		[]any{int64(1), "", int64(11)},
		[]any{int64(2), ""},
	} {
		if _, _, err := store.VersionedManyReply(cmd(v), 2); err == nil {
			t.Errorf("VersionedManyReply(%#v) accepted", v)
		}
	}
	if code, f, rec, err := store.PrewarmVersionedReply(cmd([]any{int64(store.CodePresent), "a", "b"})); err != nil || code != store.CodePresent || f != "a" || rec != "b" {
		t.Errorf("PrewarmVersionedReply = %d, %q, %q, %v", code, f, rec, err)
	}
	if _, _, _, err := store.PrewarmVersionedReply(cmd([]any{int64(6), "", ""})); err == nil {
		t.Error("PrewarmVersionedReply accepted code 6")
	}
}

func TestParseRaiseReply(t *testing.T) {
	r, err := store.ParseRaiseReply(cmd([]any{int64(0), "", "1700000000001", int64(1)}))
	if err != nil || r != (store.RaiseReply{Code: 0, Fence: "1700000000001", Fixed: true}) {
		t.Errorf("ParseRaiseReply = %+v, %v", r, err)
	}
	if r, err := store.ParseRaiseReply(cmd([]any{int64(1), "ttl set: 5", ""})); err != nil || r.Code != 1 || r.Found != "ttl set: 5" || r.Fixed {
		t.Errorf("ParseRaiseReply = %+v, %v", r, err)
	}
	for _, v := range []any{[]any{int64(1), ""}, []any{"1", "", ""}, []any{int64(1), int64(2), ""}} {
		if _, err := store.ParseRaiseReply(cmd(v)); err == nil {
			t.Errorf("ParseRaiseReply(%#v) accepted", v)
		}
	}
}
