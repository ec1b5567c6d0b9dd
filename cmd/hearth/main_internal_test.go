package main

import (
	"context"
	"io"

	"github.com/spf13/cobra"
)

// run is runWith without an abort channel, as the tests drive the command line.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return runWith(ctx, nil, args, stdout, stderr)
}

func newRoot(stdout, stderr io.Writer) *cobra.Command {
	return newRootOf(&globals{stdout: stdout, stderr: stderr})
}
