package sentinel

import (
	"errors"

	"github.com/redsem/redsem/cluster"
)

// Sentinel errors.
var (
	// ErrClosed is returned by a Pool, and by GetContext, after Close.
	ErrClosed = errors.New("redsem/sentinel: pool closed")

	// ErrNoMaster is returned when no master could be reached in time: no
	// sentinel answered, they named no reachable master, or a failover did
	// not finish within the wait (WithFailoverWait) or the context.
	ErrNoMaster = errors.New("redsem/sentinel: no reachable master")

	// ErrUnknownMaster is returned by New when a sentinel answered that it
	// monitors no master of that name.
	ErrUnknownMaster = errors.New("redsem/sentinel: sentinels monitor no master of that name")

	// ErrNotMaster is returned by a dial whose node answered ROLE as
	// something other than a master: a demoted master, or a replica the
	// sentinels named before its promotion finished. The Pool asks the
	// sentinels again.
	ErrNotMaster = errors.New("redsem/sentinel: node is not a master")

	// ErrNotReplicated is matched (errors.Is) by the error a connection of a
	// Pool with WithWait returns when too few replicas acknowledged a write
	// in time. It is the cluster package's error: WAIT works the same on
	// both.
	ErrNotReplicated = cluster.ErrNotReplicated
)

// FailoverError reports an error reply that means the node is no longer
// the master: READONLY (a write to a demoted master), UNBLOCKED (a blocked
// command cut short because the node became a replica) or MASTERDOWN. The
// Pool forgets that node and asks the sentinels again.
//
// FailoverError deliberately is not a redis.Error: callers must treat the
// command or pipeline as broken, as after a connection error, and settle
// what it may have done. redsem's Acquire does exactly that: it settles the
// acquisition by its id on a fresh connection (to the new master) and waits
// again.
type FailoverError struct {
	Addr string // the node that answered
	Msg  string // the error reply as Redis sent it
}

func (e *FailoverError) Error() string {
	return "redsem/sentinel: " + e.Addr + " is no longer the master: " + e.Msg
}
