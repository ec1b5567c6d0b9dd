//go:build !linux

package testenv

import (
	"os/exec"
	"syscall"
)

func setParentDeathSignal(*exec.Cmd, syscall.Signal) {}

func procState(int) (string, error) {
	return "", errNoProcState
}
