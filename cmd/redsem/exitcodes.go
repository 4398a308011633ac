//go:build unix

package main

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/rate"
)

// Exit codes. The run command passes its command's own exit status through,
// so these overlap with whatever the command may return; the ones redsem uses
// for its own failures follow sysexits(3), and the two a script is most
// likely to test for (busy, lease lost) can be changed with flags.
const (
	exitOK = 0
	// exitBusy: run found no free slot with -n, or the wait of -w/--timeout
	// ran out (flock's default; change it with -E).
	exitBusy = 1
	// exitUsage: a bad flag or argument, or delete without --force of a
	// semaphore that exists.
	exitUsage = 64
	// exitData: the state in Redis does not fit the request: the size
	// differs from the stored one, a key holds another type, the state is
	// corrupt, or NAME is of a kind the command does not act on (resize of a
	// lock or a rate gate).
	exitData = 65
	// exitNoName: NAME does not exist: no semaphore, mutex, read-write lock
	// or rate gate of that name under the prefix (every command that acts on
	// one name but status, which says so and exits 0). sysexits' EX_NOINPUT.
	exitNoName = 66
	// exitUnavailable: Redis could not be reached or answered with an error.
	exitUnavailable = 69
	// exitSoftware: an internal error, e.g. the demo saw more holders than
	// the semaphore's size.
	exitSoftware = 70
	// exitLost: run's lease was lost while the command ran (Redis unreachable
	// past the TTL, or the lease reclaimed or deleted): the command was sent
	// TERM, then KILL. Change it with --lost-exit-code.
	exitLost = 75
	// exitCannotExec and exitNotFound follow the shell: the command exists
	// but could not be started, or was not found.
	exitCannotExec = 126
	exitNotFound   = 127
	// exitSignalBase + N: the command was killed by signal N, or redsem got
	// signal N while it waited for a slot (the command never started).
	exitSignalBase = 128
)

// exitError carries an exit code and the one line to print for it. An empty
// message prints nothing (e.g. busy without -v, as flock does).
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

func exitf(code int, format string, args ...any) *exitError {
	return &exitError{code: code, msg: fmt.Sprintf(format, args...)}
}

// usagef reports a usage error.
func usagef(format string, args ...any) *exitError {
	return exitf(exitUsage, format, args...)
}

// codeFor maps an error from the library or the connection to an exit code.
func codeFor(err error) int {
	var ee *exitError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ee):
		return ee.code
	case errors.Is(err, redsem.ErrInvalidName), errors.Is(err, redsem.ErrInvalidSize),
		errors.Is(err, redsem.ErrInvalidTTL), errors.Is(err, redsem.ErrInvalidOption),
		errors.Is(err, rate.ErrInvalidInterval):
		return exitUsage
	case errors.Is(err, redsem.ErrSizeMismatch), errors.Is(err, rate.ErrRateMismatch), errors.Is(err, redsem.ErrWrongType),
		errors.Is(err, redsem.ErrCorrupt):
		return exitData
	default: // connection errors, Redis errors, timeouts talking to Redis
		return exitUnavailable
	}
}

// report prints err as one line on w, prefixed "redsem: " once, and returns
// its exit code.
func report(w io.Writer, err error) int {
	code := codeFor(err)
	msg := err.Error()
	var ce *connError
	if errors.As(err, &ce) {
		msg = ce.msg // the connection, not the operation that needed it
	}
	if msg == "" {
		return code
	}
	msg = strings.Join(strings.Fields(msg), " ") // one line, whatever the error holds
	if !strings.HasPrefix(msg, "redsem: ") {
		msg = "redsem: " + msg
	}
	fmt.Fprintln(w, msg)
	return code
}
