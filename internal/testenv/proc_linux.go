package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
)

func setParentDeathSignal(cmd *exec.Cmd, sig syscall.Signal) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = sig
}

// procState returns the one-letter state of pid from /proc ("R", "S", "T", ...).
func procState(pid int) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", fmt.Errorf("read process state: %w", err)
	}
	// The command name is in parentheses and may contain spaces.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+3 > len(s) {
		return "", fmt.Errorf("unexpected /proc/%d/stat: %q", pid, s)
	}
	return s[i+2 : i+3], nil
}
