// Package bench holds Hearth's benchmarks: each runs the real code against the
// real servers and prints the figures the README reports (`make bench`).
package bench
