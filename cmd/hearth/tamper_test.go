package main_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hearth-dev/hearth/internal/testenv"
)

// TestTamperFenceE2E: `SET <ns>:fence 99999999999999999` under a running
// leader. The leader's next refresh finds the foreign fence, repairs it to its
// own epoch and writes; the repair is counted and logged; the campaign never
// spins (the leader is not even fenced).
func TestTamperFenceE2E(t *testing.T) {
	srv := testenv.PrivateRedis(t)
	client := srv.Client(t)
	up := newUpstream(t)
	s := newSetup(t, srv.Addr, client, "tm:", up, shortTiming)
	a := s.start(t, "a")
	leading(t, a, 30*time.Second)
	ctx := context.Background()
	fence := s.ns + ":fence"
	attempts := a.metric(t, "hearth_lease_campaign_attempts_total")
	if err := client.Set(ctx, fence, "99999999999999999", 0).Err(); err != nil {
		t.Fatal(err)
	}
	client.Del(ctx, s.keys...)
	// Bound: the next refresh of each key (interval 3s), with room for load.
	testenv.Eventually(t, 15*time.Second, "every key written again over a foreign fence", func() bool {
		return client.Exists(ctx, s.keys...).Val() == int64(len(s.keys))
	})
	if got := a.metric(t, "hearth_state_repairs_total", `key="fence"`); got < 1 {
		t.Errorf("hearth_state_repairs_total{key=fence} = %g, want ≥ 1", got)
	}
	epoch := a.health(t).Epoch
	if got := client.Get(ctx, fence).Val(); got != strconv.FormatInt(epoch, 10) {
		t.Errorf("fence = %q after the repair, want the leader's epoch %d", got, epoch)
	}
	if n := a.metric(t, "hearth_lease_campaign_attempts_total") - attempts; n > 2 {
		t.Errorf("%g campaign attempts after the tamper, want ≤ 2", n)
	}
	if out := a.proc.Output(); !strings.Contains(out, "foreign value in hearth's own key") || !strings.Contains(out, "99999999999999999") {
		t.Errorf("no repair log naming the foreign fence in:\n%s", out)
	}
}
