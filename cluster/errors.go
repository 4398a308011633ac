package cluster

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/gomodule/redigo/redis"
)

// Sentinel errors.
var (
	// ErrClosed is returned by a Pool, and by its connections, after Close.
	ErrClosed = errors.New("redsem/cluster: pool closed")

	// ErrNoNode is returned when no node of the cluster answered CLUSTER
	// SLOTS, or the slot map still has no master for a slot after the
	// retries WithMaxRedirects allows (a failover leaves none for a moment).
	ErrNoNode = errors.New("redsem/cluster: no reachable node")

	// ErrNotReplicated is matched (errors.Is) by *NotReplicatedError.
	ErrNotReplicated = errors.New("redsem/cluster: write not acknowledged by enough replicas")
)

// RedirectError reports a cluster redirection or a transient cluster state
// that came back inside a pipeline (Send, Flush, Receive), where it is not
// followed: MOVED, ASK, TRYAGAIN, CLUSTERDOWN, UNBLOCKED (a blocked command
// whose node became a replica), READONLY, LOADING or MASTERDOWN. The slot map
// is refreshed, so the same pipeline on a new connection goes to the right
// node.
//
// RedirectError deliberately is not a redis.Error: callers must treat the
// pipeline as broken, as after a connection error, and settle what it may
// have done. redsem's Acquire does exactly that: it settles the acquisition
// by its id on a fresh connection and waits again.
type RedirectError struct {
	Kind string // "MOVED", "ASK", "TRYAGAIN", ...
	Slot int    // for MOVED and ASK, else -1
	Addr string // for MOVED and ASK: the node to ask
	Msg  string // the error reply as Redis sent it
}

func (e *RedirectError) Error() string {
	return "redsem/cluster: pipeline redirected: " + e.Msg
}

// NotReplicatedError is returned by a connection with the WAIT option when
// WAIT reported fewer replicas than asked for, or failed. The write itself
// took effect on the master; it may be lost if the master fails before a
// replica receives it. It matches ErrNotReplicated.
type NotReplicatedError struct {
	Want, Acked int
	Err         error // WAIT's own error, if it failed
}

func (e *NotReplicatedError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("redsem/cluster: WAIT %d failed: %v", e.Want, e.Err)
	}
	return fmt.Sprintf("redsem/cluster: write reached %d of %d replicas", e.Acked, e.Want)
}

// Unwrap lets errors.Is(err, ErrNotReplicated) hold.
func (e *NotReplicatedError) Unwrap() []error {
	if e.Err != nil {
		return []error{ErrNotReplicated, e.Err}
	}
	return []error{ErrNotReplicated}
}

// redirect classifies an error reply: its kind ("" when it is an ordinary
// error), and for MOVED and ASK the slot and address.
func redirect(err error) (kind string, slot int, addr string) {
	re, ok := err.(redis.Error)
	if !ok {
		return "", -1, ""
	}
	msg := string(re)
	word, rest, _ := strings.Cut(msg, " ")
	switch word {
	case "MOVED", "ASK":
		s, a, ok := strings.Cut(rest, " ")
		n, err := strconv.Atoi(s)
		if !ok || err != nil || n < 0 || n >= SlotCount || a == "" {
			return "", -1, ""
		}
		return word, n, a
	case "TRYAGAIN", "CLUSTERDOWN", "UNBLOCKED", "READONLY", "LOADING", "MASTERDOWN":
		return word, -1, ""
	}
	return "", -1, ""
}
