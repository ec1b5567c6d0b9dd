package main

import (
	"bytes"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestSecondSignalExits: the first signal only drains; the second aborts the
// drain and ends the process after the grace even though nothing else stops it (a component
// stuck in its shutdown).
func TestSecondSignalExits(t *testing.T) {
	sigs := make(chan os.Signal, 2)
	code := make(chan int, 1)
	var stderr bytes.Buffer
	abort := make(chan struct{})
	go exitOnSecondSignal(sigs, abort, 10*time.Millisecond, &stderr, func(c int) { code <- c })
	sigs <- syscall.SIGTERM
	select {
	case c := <-code:
		t.Fatalf("exited %d on the first signal: it must drain", c)
	case <-abort:
		t.Fatal("the first signal aborted the drain")
	case <-time.After(200 * time.Millisecond):
	}
	sigs <- syscall.SIGINT
	select {
	case <-abort:
	case <-time.After(10 * time.Second):
		t.Fatal("the second signal did not abort the drain")
	}
	select {
	case c := <-code:
		if c != exitFail {
			t.Errorf("exit code %d, want %d", c, exitFail)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the second signal did not end the process")
	}
	if !strings.Contains(stderr.String(), "second signal") {
		t.Errorf("stderr %q does not say why it exited", stderr.String())
	}
}

// TestSIGHUPRequestsReload: SIGHUP to the process is a reload request, not
// its end; requests sent while one is pending merge into it.
func TestSIGHUPRequestsReload(t *testing.T) {
	reload, stop := notifyReload()
	defer stop()
	for range 3 {
		if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-reload:
	case <-time.After(10 * time.Second):
		t.Fatal("SIGHUP did not ask for a reload")
	}
	// At most one more: the three signals merged into one or two requests.
	time.Sleep(100 * time.Millisecond)
	select {
	case <-reload:
	default:
	}
	select {
	case <-reload:
		t.Error("three SIGHUPs in a row asked for three reloads")
	case <-time.After(100 * time.Millisecond):
	}
}
