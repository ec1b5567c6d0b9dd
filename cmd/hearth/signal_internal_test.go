package main

import (
	"bytes"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestSecondSignalExits: the first signal only drains; the second ends the
// process after the grace even though nothing else stops it (a component
// stuck in its shutdown).
func TestSecondSignalExits(t *testing.T) {
	sigs := make(chan os.Signal, 2)
	code := make(chan int, 1)
	var stderr bytes.Buffer
	go exitOnSecondSignal(sigs, 10*time.Millisecond, &stderr, func(c int) { code <- c })
	sigs <- syscall.SIGTERM
	select {
	case c := <-code:
		t.Fatalf("exited %d on the first signal: it must drain", c)
	case <-time.After(200 * time.Millisecond):
	}
	sigs <- syscall.SIGINT
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
