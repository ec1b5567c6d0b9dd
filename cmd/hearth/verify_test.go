package main_test

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hearth-dev/hearth/internal/e2e"
	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/store"
)

// TestVersionedValuesRepairedE2E runs the binary on a version-checked family
// (version_column, interval 2 s) whose query goes through a function that
// logs every member it loads, so that origin loads are counted at the
// origin. From a separate client it then plants what the version check used
// to trust, and polls for the origin's value:
//   - a foreign value of the right length (SET … KEEPTTL): replaced within one
//     interval (before: only its TTL was extended, for good);
//   - an application's older value of the same length under an untouched
//     record: replaced;
//   - a well-formed record with a far-future version and the value deleted:
//     present again within one interval and one load, at most one extra load
//     of that member, none in the runs after (before: absent until the record
//     expired);
//   - malformed records (a version above the range, nan, inf, 1e999, text) with
//     the values deleted: present again within one interval.
//
// Each is counted in hearth_version_repairs_total and logged naming the key.
func TestVersionedValuesRepairedE2E(t *testing.T) {
	t.Parallel()
	rd := testenv.Redis(t)
	pg := testenv.Postgres(t)
	ctx := context.Background()
	exec := func(q string) {
		t.Helper()
		if _, err := pg.Pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	exec(`CREATE TABLE products (id bigint PRIMARY KEY, price text NOT NULL, version bigint NOT NULL)`)
	exec(`INSERT INTO products SELECT i, 'price:' || lpad((i * 100)::text, 5, '0'), 1 FROM generate_series(1, 10) i`)
	exec(`CREATE TABLE loads (id bigint NOT NULL)`)
	exec(`CREATE FUNCTION load_products(ids bigint[]) RETURNS TABLE (id text, v text, version bigint) LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO loads SELECT unnest(ids);
  RETURN QUERY SELECT p.id::text, p.price, p.version FROM products p WHERE p.id = ANY(ids);
END $$`)
	loads := func(id int) int {
		t.Helper()
		var n int
		if err := pg.Pool.QueryRow(ctx, `SELECT count(*) FROM loads WHERE id = $1`, id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	const interval = 2 * time.Second
	ns := e2e.Namespace(t, rd.Client)
	listen := e2e.FreeAddr(t)
	p := rd.Prefix
	cfg := writeConfig(t, fmt.Sprintf(`
redis: {addrs: [%q], namespace: %q}
http: {listen: %q}
log: {format: json}
refresh: {load_timeout: 2s, jitter: 0, spread: 0}
leader: {lease: 2s, retry_period: 250ms}
sources: [{name: db, type: postgres, dsn: %q, rate: 0}]
keys:
  - name: product
    key: "%sproduct:{id}"
    source: db
    ttl: 12s
    interval: %s
    param_pattern: "[0-9]{1,6}"
    members_query: "SELECT id::text FROM products ORDER BY id"
    query: "SELECT id, v, version FROM load_products($1::bigint[])"
    version_column: version
`, rd.Addr, ns, listen, pg.DSN, p, interval))
	proc := e2e.Start(t, []string{"run", "--config", cfg})
	proc.WaitHTTP(t, "http://"+listen+"/readyz", http.StatusOK, 30*time.Second)
	metrics := "http://" + listen + "/metrics"

	key := func(id int) string { return p + "product:" + strconv.Itoa(id) }
	price := func(id int) string { return fmt.Sprintf("price:%05d", id*100) }
	get := func(id int) string { return rd.Client.Get(ctx, key(id)).Val() }
	testenv.Eventually(t, 10*time.Second, "every product in Redis", func() bool {
		for id := 1; id <= 10; id++ {
			if get(id) != price(id) {
				return false
			}
		}
		return true
	})
	// Bound: one interval, plus a load and a write on this shared machine.
	bound := interval + 2*time.Second
	repaired := func(t *testing.T, what string, ids []int, want func(int) string) {
		t.Helper()
		t0 := time.Now()
		testenv.Eventually(t, 3*bound, what, func() bool {
			for _, id := range ids {
				if get(id) != want(id) {
					return false
				}
			}
			return true
		})
		took := time.Since(t0)
		if took > bound {
			t.Errorf("%s took %s, want within %s (one interval and a load)", what, took.Round(time.Millisecond), bound)
		}
		t.Logf("%s: %s", what, took.Round(time.Millisecond))
	}

	t.Run("foreign value of the same length", func(t *testing.T) {
		if err := rd.Client.Do(ctx, "SET", key(1), "price:99999", "KEEPTTL").Err(); err != nil {
			t.Fatal(err)
		}
		repaired(t, "a foreign value of the same length replaced", []int{1}, price)
	})
	t.Run("older value of the same length", func(t *testing.T) {
		// An application's older value under the record Hearth wrote for the
		// newer one.
		exec(`UPDATE products SET price = 'price:00250', version = 2 WHERE id = 2`)
		testenv.Eventually(t, 3*bound, "the update in Redis", func() bool { return get(2) == "price:00250" })
		if err := rd.Client.Do(ctx, "SET", key(2), "price:00200", "KEEPTTL").Err(); err != nil {
			t.Fatal(err)
		}
		repaired(t, "an older value of the same length replaced", []int{2}, func(int) string { return "price:00250" })
	})
	// A 128-bit hash, as records of the earlier format carry: well-formed for
	// the code before this check as well as after.
	h := sha1.Sum([]byte("x"))
	hash := hex.EncodeToString(h[:16])
	t.Run("planted far-future record", func(t *testing.T) {
		before5, before1 := loads(5), loads(1)
		if err := rd.Client.Set(ctx, store.VersionKey(ns, key(5)), "1:1:"+store.EncodeVersion(math.MaxInt64)+":"+hash, 15*time.Second).Err(); err != nil {
			t.Fatal(err)
		}
		rd.Client.Del(ctx, key(5))
		repaired(t, "a value held off by a planted record present again", []int{5}, price)
		extra := (loads(5) - before5) - (loads(1) - before1)
		t.Logf("extra loads of product 5: %d", extra)
		if extra > 1 {
			t.Errorf("the planted record cost %d extra loads of product 5, want at most 1", extra)
		}
		// From then on, one load per run like every member.
		a5, a1 := loads(5), loads(1)
		time.Sleep(2*interval + interval/2)
		if d5, d1 := loads(5)-a5, loads(1)-a1; d5 != d1 || d1 == 0 {
			t.Errorf("after the repair: %d loads of product 5, %d of product 1 in the same runs; want equal, not zero", d5, d1)
		}
	})
	t.Run("malformed records", func(t *testing.T) {
		for id, rec := range map[int]string{
			6:  "1:1:99999999999999999999:" + hash,
			7:  "1:1:nan:" + hash,
			8:  "1:inf::" + hash,
			9:  "1e999:1::" + hash,
			10: "not a record",
		} {
			if err := rd.Client.Set(ctx, store.VersionKey(ns, key(id)), rec, 15*time.Second).Err(); err != nil {
				t.Fatal(err)
			}
			rd.Client.Del(ctx, key(id))
			t.Run(strconv.Itoa(id), func(t *testing.T) { repaired(t, "the value under "+rec+" present again", []int{id}, price) })
		}
	})

	m := e2e.Metrics(t, metrics)
	for reason, want := range map[string]float64{"value_mismatch": 2, "value_absent": 1, "record_unconfirmed": 1, "record_malformed": 5} {
		if got := e2e.Sum(m, "hearth_version_repairs_total", `family="product"`, `reason="`+reason+`"`); got < want {
			t.Errorf("hearth_version_repairs_total{reason=%q} = %v, want ≥ %v", reason, got, want)
		}
	}
	if got := e2e.Sum(m, "hearth_conditional_extends_total", `family="product"`); got < 10 {
		t.Errorf("conditional extends %v: unchanged values should still be extended, not rewritten", got)
	}
	out := proc.Output()
	for _, want := range []string{`"reason":"value_mismatch"`, `"key":"` + key(1) + `"`, `"reason":"record_unconfirmed"`, `"key":"` + key(5) + `"`} {
		if !strings.Contains(out, want) {
			t.Errorf("no %s in the log", want)
		}
	}
	proc.Signal(t, syscall.SIGTERM)
	if code := proc.Wait(t, 20*time.Second); code != 0 {
		t.Fatalf("exit %d\n%s", code, proc.Output())
	}
}
