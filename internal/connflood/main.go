// Command connflood is a test harness, never part of the daemon: it floods an
// HTTP listener on loopback with connections, from a process of its own so
// that the flood's goroutines never delay the test's probes. Modes:
//
//	churn    each client opens a connection (every other one sends one
//	         request and never reads the answer), holds it a while, closes
//	         it and reopens;
//	trickle  each client sends a request's headers, then its body one byte
//	         at a time, and reconnects when the server closes it.
//
// It stops when its standard input closes or -duration passes, and prints its
// counters as a JSON line every 250 ms and once more at the end.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// Stats are the flood's counters.
type Stats struct {
	// Started is how many clients got a first connection going (for
	// trickle, their headers sent).
	Started int64 `json:"started"`
	Dials   int64 `json:"dials"`
	Failed  int64 `json:"failed"`
	Open    int64 `json:"open"`
	Done    bool  `json:"done"`
}

func main() {
	addr := flag.String("addr", "", "host:port to flood (loopback)")
	mode := flag.String("mode", "churn", "churn or trickle")
	clients := flag.Int("clients", 1000, "concurrent clients")
	ramp := flag.Duration("ramp", 4*time.Second, "clients start spread over this")
	holdMin := flag.Duration("hold-min", 2*time.Second, "churn: shortest hold")
	holdMax := flag.Duration("hold-max", 4*time.Second, "churn: longest hold")
	every := flag.Duration("trickle-every", 200*time.Millisecond, "trickle: one body byte this often")
	duration := flag.Duration("duration", 60*time.Second, "hard stop")
	flag.Parse()
	if host, _, err := net.SplitHostPort(*addr); err != nil || !net.ParseIP(host).IsLoopback() {
		fmt.Fprintf(os.Stderr, "connflood: -addr must be a loopback host:port (got %q)\n", *addr)
		os.Exit(2)
	}
	ctx, stop := context.WithTimeout(context.Background(), *duration)
	defer stop()
	go func() { // stdin closed: the test is done
		_, _ = io.Copy(io.Discard, os.Stdin)
		stop()
	}()

	var st struct{ started, dials, failed, open atomic.Int64 }
	report := func(done bool) {
		b, _ := json.Marshal(Stats{Started: st.started.Load(), Dials: st.dials.Load(), Failed: st.failed.Load(), Open: st.open.Load(), Done: done})
		fmt.Println(string(b))
	}
	heads := []string{
		"POST /admin/refresh?declaration=single HTTP/1.1\r\nAuthorization: Bearer listener-test-token\r\n",
		"POST /admin/prewarm HTTP/1.1\r\n",
		"POST /healthz HTTP/1.1\r\n",
		"PUT /metrics HTTP/1.1\r\n",
	}
	var wg sync.WaitGroup
	for i := range *clients {
		wg.Go(func() {
			if !sleep(ctx, time.Duration(rand.Int64N(int64(*ramp)+1))) {
				return
			}
			first := true
			for ctx.Err() == nil {
				c, err := net.DialTimeout("tcp", *addr, time.Second)
				if err != nil {
					st.failed.Add(1)
					sleep(ctx, time.Second)
					continue
				}
				st.dials.Add(1)
				st.open.Add(1)
				switch *mode {
				case "trickle":
					head := heads[i%len(heads)] + "Host: hearth\r\nContent-Length: 4000\r\n\r\n"
					if _, err := io.WriteString(c, head); err == nil {
						if first {
							st.started.Add(1)
							first = false
						}
						for sleep(ctx, *every) {
							if _, err := c.Write([]byte{'x'}); err != nil {
								break
							}
						}
					}
				default:
					if first {
						st.started.Add(1)
						first = false
					}
					if i%2 == 0 {
						_, _ = io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: hearth\r\n\r\n")
					}
					sleep(ctx, *holdMin+time.Duration(rand.Int64N(int64(*holdMax-*holdMin)+1)))
				}
				c.Close()
				st.open.Add(-1)
			}
		})
	}
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for ctx.Err() == nil {
		select {
		case <-tick.C:
			report(false)
		case <-ctx.Done():
		}
	}
	wg.Wait()
	report(true)
}

// sleep waits d or until ctx ends; false if it ended.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
