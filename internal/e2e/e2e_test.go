package e2e

import (
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"
)

// fatalTB records the first Fatalf and ends the goroutine, as testing.T does.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Helper() {}

func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// A process that exits before it serves fails the wait at once, with its exit,
// rather than after the whole wait.
func TestProcWaitHTTPStopsWhenTheProcessExits(t *testing.T) {
	p := StartBinary(t, "/bin/sh", []string{"-c", "echo refused; exit 3"})
	url := "http://" + FreeAddr(t) + "/readyz"
	f := &fatalTB{TB: t}
	done := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(done)
		p.WaitHTTP(f, url, http.StatusOK, time.Minute)
	}()
	<-done
	if took := time.Since(start); took > 30*time.Second {
		t.Errorf("the wait took %s after the process exited", took)
	}
	if !strings.Contains(f.msg, "exited (exit status 3)") || !strings.Contains(f.msg, url) {
		t.Errorf("failure = %q, want the URL and the exit status", f.msg)
	}
}
