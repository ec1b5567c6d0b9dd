package claims

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"
)

// claimNow claims and reports whether it was granted without waiting.
func claimNow(t *testing.T, c *Set, members []string, p Place) (func(), bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	release, err := c.Claim(ctx, members, p)
	if err != nil {
		return nil, false
	}
	return release, true
}

// The cases a held batch must block: a span of the same list at overlapping
// positions, a span of another list (a run that listed again) holding the
// same names elsewhere, a batch by name sharing a member with a span and the
// other way round; and the cases it must not.
func TestClaimsSpansAndNames(t *testing.T) {
	list := []string{"a", "b", "c", "d", "e", "f"}
	relisted := []string{"f", "e", "d", "c", "b", "a"}
	cases := []struct {
		name         string
		held, next   []string
		heldP, nextP Place
		wantBlocked  bool
	}{
		{"same list, disjoint spans", list[0:3], list[3:6], Place{list, 0}, Place{list, 3}, false},
		{"same list, overlapping spans", list[0:3], list[2:5], Place{list, 0}, Place{list, 2}, true},
		{"another list, same names", list[0:2], relisted[4:6], Place{list, 0}, Place{relisted, 4}, true},
		{"another list, other names", list[0:2], relisted[0:2], Place{list, 0}, Place{relisted, 0}, false},
		{"by name against a span", list[1:3], []string{"x", "c"}, Place{list, 1}, Place{}, true},
		{"by name beside a span", list[1:3], []string{"x", "d"}, Place{list, 1}, Place{}, false},
		{"a span against names", []string{"e"}, list[3:6], Place{}, Place{list, 3}, true},
		{"a span beside names", []string{"a"}, list[3:6], Place{}, Place{list, 3}, false},
		{"names against names", []string{"q", "a"}, []string{"a"}, Place{}, Place{}, true},
		{"a place outside its list is held by name", list[4:6], list[4:6], Place{list, 4}, Place{list, 5}, true},
		{"a place that is not the batch's is held by name", list[0:2], list[0:2], Place{list, 0}, Place{list, 3}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var c Set
			release, ok := claimNow(t, &c, tc.held, tc.heldP)
			if !ok {
				t.Fatal("the first claim waited with nothing held")
			}
			r2, granted := claimNow(t, &c, tc.next, tc.nextP)
			if granted == tc.wantBlocked {
				t.Fatalf("second claim granted=%v, want blocked=%v", granted, tc.wantBlocked)
			}
			if granted {
				r2()
			}
			release()
			// Once let go, the second is granted, and nothing is left held.
			r3, ok := claimNow(t, &c, tc.next, tc.nextP)
			if !ok {
				t.Fatal("the second claim still waits after the first was released")
			}
			r3()
			if len(c.spans) != 0 || len(c.by) != 0 {
				t.Fatalf("after every release: %d spans, %d names still held", len(c.spans), len(c.by))
			}
		})
	}
}

// Property: whatever mix of spans (of two lists holding the same members in
// different orders) and batches by name (repeats allowed) claims at once, no
// member is ever held by two batches.
func TestClaimsNeverShareAMember(t *testing.T) {
	const n = 40
	a := make([]string, n)
	for i := range a {
		a[i] = fmt.Sprint("m", i)
	}
	b := append([]string(nil), a...)
	rand.New(rand.NewPCG(1, 2)).Shuffle(n, func(i, j int) { b[i], b[j] = b[j], b[i] })
	var (
		c      Set
		mu     sync.Mutex
		holds  = map[string]int{}
		wg     sync.WaitGroup
		shared = make(chan string, 1)
	)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 7))
			for range 300 {
				var members []string
				var p Place
				switch r.IntN(3) {
				case 0, 1:
					list := a
					if r.IntN(2) == 1 {
						list = b
					}
					lo := r.IntN(n)
					hi := lo + 1 + r.IntN(min(8, n-lo))
					members, p = list[lo:hi], Place{list, lo}
				default:
					for range 1 + r.IntN(6) {
						members = append(members, a[r.IntN(n)])
					}
				}
				release, err := c.Claim(context.Background(), members, p)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				distinct := map[string]bool{}
				for _, m := range members {
					if !distinct[m] {
						distinct[m] = true
						holds[m]++
						if holds[m] > 1 {
							select {
							case shared <- m:
							default:
							}
						}
					}
				}
				mu.Unlock()
				runtime.Gosched()
				mu.Lock()
				for m := range distinct {
					holds[m]--
				}
				mu.Unlock()
				release()
			}
		}()
	}
	wg.Wait()
	select {
	case m := <-shared:
		t.Fatalf("member %s was held by two batches at once", m)
	default:
	}
	if len(c.spans) != 0 || len(c.by) != 0 {
		t.Fatalf("after every release: %d spans, %d names still held", len(c.spans), len(c.by))
	}
}
