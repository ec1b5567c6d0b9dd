package testenv

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// errNoProcState is returned by procState where the state cannot be read.
var errNoProcState = errors.New("process state is only known on linux")

// waitState waits until pid's state is (or, with not, is no longer) state.
func waitState(pid int, state string, not bool) error {
	return waitFor(5*time.Second, 5*time.Millisecond, nil, func() error {
		got, err := procState(pid)
		if errors.Is(err, errNoProcState) {
			return nil
		}
		if err != nil {
			return err
		}
		if (got == state) != not {
			return nil
		}
		return fmt.Errorf("pid %d is in state %s", pid, got)
	})
}

// proc is a server process started by this package.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
	err  error         // Wait's result, valid once done is closed
}

// startProc starts cmd with parent-death signal deathSig, so that the server
// does not outlive a test binary that crashed or was killed.
func startProc(cmd *exec.Cmd, deathSig syscall.Signal) (*proc, error) {
	setParentDeathSignal(cmd, deathSig)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", cmd.Path, err)
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

// exitNote describes how the process exited, if it has.
func (p *proc) exitNote() string {
	if !p.exited() {
		return ""
	}
	if p.err == nil {
		return " (it exited with status 0)"
	}
	return fmt.Sprintf(" (it exited: %v)", p.err)
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// signal sends sig to the process unless it has already exited.
func (p *proc) signal(sig os.Signal) error {
	if p.exited() {
		return nil
	}
	err := p.cmd.Process.Signal(sig)
	if err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("send %v to pid %d: %w", sig, p.pid(), err)
	}
	return nil
}

// wait waits up to timeout for the process to exit.
func (p *proc) wait(timeout time.Duration) bool {
	select {
	case <-p.done:
		return true
	case <-time.After(timeout):
		return false
	}
}

// kill sends SIGKILL and waits for the exit.
func (p *proc) kill() error {
	if err := p.signal(syscall.SIGKILL); err != nil {
		return err
	}
	if !p.wait(10 * time.Second) {
		return fmt.Errorf("pid %d did not exit after SIGKILL", p.pid())
	}
	return nil
}

// logTail returns the last bytes of the log file at path, for error messages.
func logTail(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	const max = 2048
	if st, err := f.Stat(); err == nil && st.Size() > max {
		_, _ = f.Seek(st.Size()-max, io.SeekStart)
	}
	b, _ := io.ReadAll(f)
	s := strings.TrimSpace(string(b))
	if s == "" {
		return ""
	}
	return "\n--- " + path + " ---\n" + s
}
