//go:build unix

package main

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
)

const exporterHelp = `Usage: redsem exporter [flags]

Serves Prometheus metrics for every semaphore, mutex and rate gate under a
prefix on /metrics. It runs the redsem-exporter command with the same
arguments: the one next to this redsem binary, else the first on PATH. It is
a separate command so that redsem itself does not carry the Prometheus
client; install it with

  go install github.com/redsem/redsem/exporter/cmd/redsem-exporter@latest

Its flags ("redsem exporter --help" shows them all):
  --listen ADDR    address to serve on (default ":9464")
  --prefix P       key prefix to scan (default "redsem:")
  --redis URL      Redis to read; default $REDIS_URL, else redis://127.0.0.1:6379
  --limit N        report at most N names per scrape (default 1000)

Example:
  redsem exporter --listen :9464 --prefix redsem:
`

// exporterCommand is the program "redsem exporter" runs.
const exporterCommand = "redsem-exporter"

// cmdExporter replaces this process with redsem-exporter, passing args, the
// environment and the standard streams on, so signals and the exit code are
// the exporter's own.
func cmdExporter(args []string, _, _ io.Writer) error {
	path, err := findExporter()
	if err != nil {
		return usagef("exporter: %s not found next to redsem or on PATH; install it: go install github.com/redsem/redsem/exporter/cmd/redsem-exporter@latest", exporterCommand)
	}
	err = syscall.Exec(path, append([]string{exporterCommand}, args...), os.Environ())
	return exitf(exitCannotExec, "exporter: cannot run %s: %v", path, err)
}

// findExporter looks for redsem-exporter next to the running redsem (its
// real path), then on PATH.
func findExporter() (string, error) {
	if self, err := os.Executable(); err == nil {
		if real, err := filepath.EvalSymlinks(self); err == nil {
			self = real
		}
		next := filepath.Join(filepath.Dir(self), exporterCommand)
		if fi, err := os.Stat(next); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return next, nil
		}
	}
	return exec.LookPath(exporterCommand)
}
