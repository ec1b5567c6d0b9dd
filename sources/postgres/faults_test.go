package postgres_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/keytmpl"
	"github.com/hearth-dev/hearth/sources/postgres"
	"github.com/hearth-dev/hearth/sources/protect"
	"github.com/hearth-dev/hearth/warmer"
)

func family(t *testing.T, query string) *warmer.Spec {
	t.Helper()
	tp, err := keytmpl.Parse("item:{id}")
	if err != nil {
		t.Fatal(err)
	}
	return &warmer.Spec{Name: "item", Template: tp, Query: query}
}

// TestServerGoneIsUnavailable: a query on a connection the server killed, and
// one that cannot connect, are origin failures worth retrying, not bad payloads.
func TestServerGoneIsUnavailable(t *testing.T) {
	opt := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, opt) })
	pgs := testenv.PrivatePostgres(t)
	src, err := postgres.New(postgres.Config{Name: "db", DSN: pgs.DSN()})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	s := family(t, `SELECT m, 'v-' || m FROM unnest($1::text[]) m`)
	ctx := context.Background()
	if _, err := src.Load(ctx, s, []string{"1"}); err != nil {
		t.Fatal(err)
	}
	pgs.Stop(t)
	for _, phase := range []string{"pooled connection killed", "connection refused"} {
		_, err := src.Load(ctx, s, []string{"1"})
		if !errors.Is(err, warmer.ErrUnavailable) || !protect.Retryable(err) {
			t.Errorf("%s: err = %v, want ErrUnavailable", phase, err)
		}
		if errors.Is(err, warmer.ErrBadPayload) {
			t.Errorf("%s: reported as a bad payload: %v", phase, err)
		}
	}
	pgs.Start(t)
	rs, err := src.Load(ctx, s, []string{"1"})
	if err != nil {
		t.Fatalf("after restart: %v", err)
	}
	if got, want := string(rs[0].Value), "v-1"; got != want {
		t.Errorf("after restart: value %q, want %q", got, want)
	}
}

// TestQueryMistakesAreNotRetried: a query that is wrong stays wrong.
func TestQueryMistakesAreNotRetried(t *testing.T) {
	pg := testenv.Postgres(t)
	src, err := postgres.New(postgres.Config{Name: "db", DSN: pg.DSN})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	for query, want := range map[string]string{
		`SELECT m FROM unnest($1::text[]) m`:               "must return 2 column(s) (member, value), got 1",
		`SELECT m, v FROM no_such_table WHERE m = ANY($1)`: "no_such_table",
	} {
		_, err := src.Load(context.Background(), family(t, query), []string{"1"})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err = %v, want %q", query, err, want)
		}
		if protect.Retryable(err) {
			t.Errorf("%s: %v is marked worth retrying", query, err)
		}
	}
}
