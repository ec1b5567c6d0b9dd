//go:build unix

package main

import (
	"fmt"
	"os"
	"syscall"
)

// execDemo replaces hearth with the demo, so that the demo gets the
// terminal's signals itself and its exit code is the process's.
func execDemo(path string, args []string) error {
	err := syscall.Exec(path, append([]string{path}, args...), os.Environ())
	return fmt.Errorf("demo: run %s: %w", path, err)
}
