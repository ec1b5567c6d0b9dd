package leader_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/leader"
)

// TestLeaseHolder: Holder names the instance and epoch of the lease's holder,
// reports a free lease as not held, and a value no Hearth writes as an error
// that quotes it, never as a leader.
func TestLeaseHolder(t *testing.T) {
	rd := testenv.Redis(t)
	ns := rd.Prefix + "ns"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := leader.NewLease(leader.LeaseOptions{Client: rd.Client, Namespace: ns, ID: "a-1", Duration: 5 * time.Second,
		RetryPeriod: time.Second, Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	if _, _, held, err := l.Holder(ctx); held || err != nil {
		t.Fatalf("before any campaign: held %v, %v; want free", held, err)
	}
	term, err := l.Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	inst, epoch, held, err := l.Holder(ctx)
	if err != nil || !held || inst != "a-1" || epoch != term.Epoch {
		t.Fatalf("Holder = %q, %d, %v, %v; want a-1 at epoch %d", inst, epoch, held, err, term.Epoch)
	}
	if err := term.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"garbage", "nan:x/1", "-5:x/1", "7:noslash", "7:/1"} {
		if err := rd.Client.Set(ctx, ns+":{lease}", v, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		inst, epoch, held, err := l.Holder(ctx)
		if err == nil || !strings.Contains(err.Error(), "not a Hearth lease value") || inst != "" || epoch != 0 || !held {
			t.Errorf("lease %q: Holder = %q, %d, %v, %v; want an error naming the value", v, inst, epoch, held, err)
		}
	}
}
