package admin

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/gomodule/redigo/redis"

	"github.com/redsem/redsem/internal/engine"
)

// ErrRepairUnsafe is returned by Repair when tokens are missing but minting
// them again could hand out an extra permit: something is held or in flight.
// The error says what; everything else Repair does was done.
var ErrRepairUnsafe = errors.New("redsem: repair unsafe")

// Inventory is where every token of a semaphore is, read in one script by
// Check. Leased, Pending and Free hold valid tokens ("<epoch>:<slot>", slot
// 1..Size), each once, in the first place it was found in this order: a
// lease, a waiter's pending list, the token list.
type Inventory struct {
	Name   string
	Exists bool // false when the semaphore was never created (or deleted)
	Size   int  // as stored in Redis; 0 when it does not exist
	Epoch  string
	// Leased are the valid tokens with a lease (expired ones included until
	// they are reclaimed).
	Leased []string
	// Pending are the valid tokens a blocked waiter's BLMOVE has moved into
	// its pending list and its lease script has not yet taken.
	Pending []string
	// Free are the valid tokens on the token list.
	Free []string
	// Retired are leases on tokens that are not valid now: tokens above the
	// size still held after a shrink (they drain as the holders give them
	// back), or leases someone wrote by hand. They are not counted in
	// Healthy.
	Retired []string
	// Duplicates lists every further copy of a valid token: on the list
	// twice, or on the list or in a pending list while leased or pending
	// elsewhere.
	Duplicates []string
	// Strangers lists the elements of the token list and of pending lists
	// that are not valid tokens: forged, of an older epoch, not canonical,
	// or above the size (retired).
	Strangers []string
	// Missing lists the slots, 1..Size, whose token is nowhere.
	Missing []int
	// Withheld are valid tokens kept off the list while a shrink drains:
	// as many as there are leases on retired tokens still out (see Resize).
	Withheld []string
	// ServerTime is Redis TIME when the inventory was read.
	ServerTime time.Time
}

// Healthy reports whether the inventory is whole: every slot's token in
// exactly one place (len(Free)+len(Pending)+len(Leased)+len(Withheld) ==
// Size), no duplicate and no stranger. A semaphore that does not exist and
// has no keys is healthy.
func (inv Inventory) Healthy() bool {
	return len(inv.Free)+len(inv.Pending)+len(inv.Leased)+len(inv.Withheld) == inv.Size &&
		len(inv.Duplicates) == 0 && len(inv.Strangers) == 0
}

// Check reads where every token of the semaphore is, in one script that
// writes nothing, against the size stored in Redis. Errors: ErrWrongType,
// ErrCorrupt (unreadable meta), or a connection error.
func (h *Handle) Check(ctx context.Context) (Inventory, error) {
	vals, err := redis.Values(h.call(ctx, "check", engine.Check.With(h.keys(), engine.NoArgs{})))
	if err != nil {
		return Inventory{}, err
	}
	inv := Inventory{Name: h.name}
	var exists int
	var nowUs int64
	_, err = redis.Scan(vals, &exists, &inv.Size, &inv.Epoch, &nowUs, &inv.Leased, &inv.Pending,
		&inv.Free, &inv.Retired, &inv.Duplicates, &inv.Strangers, &inv.Missing, &inv.Withheld)
	if err != nil {
		return Inventory{}, fmt.Errorf("redsem: check %q: %w", engine.Printable(h.name), err)
	}
	inv.Exists = exists == 1
	inv.ServerTime = time.UnixMicro(nowUs)
	return inv, nil
}

// RepairReport says what Repair did.
type RepairReport struct {
	// Reclaimed counts the tokens of expired leases and of stale pending
	// lists that were given back first, as Reclaim does.
	Reclaimed int
	// Dropped lists the strangers and duplicate copies removed from the
	// token list.
	Dropped []string
	// Minted lists the missing tokens that were pushed again.
	Minted []string
	// Missing lists the slots still missing: not minted because it was
	// unsafe (Repair then returns ErrRepairUnsafe).
	Missing []int
}

// Repair restores the inventory Check reports, in one atomic script: it
// gives back the tokens of expired leases and stale pending lists (as
// Reclaim), drops strangers and duplicates from the token list, and mints
// the missing slots again only when Redis records no holder and no pending
// token at all; otherwise it returns the report and an error matching
// ErrRepairUnsafe that says what blocks it. See docs/resize-and-repair.md.
func (h *Handle) Repair(ctx context.Context) (RepairReport, error) {
	vals, err := redis.Values(h.call(ctx, "repair", engine.Repair.With(h.keys(), engine.NoArgs{})))
	if err != nil {
		return RepairReport{}, err
	}
	var r RepairReport
	var leases, records, pending int
	if _, err := redis.Scan(vals, &r.Reclaimed, &r.Dropped, &r.Minted, &r.Missing, &leases, &records, &pending); err != nil {
		return RepairReport{}, fmt.Errorf("redsem: repair %q: %w", engine.Printable(h.name), err)
	}
	if len(r.Missing) == 0 {
		return r, nil
	}
	var why []string
	for _, c := range []struct {
		n    int
		what string
	}{{leases, "lease"}, {records, "lease record"}, {pending, "pending list"}} {
		if c.n == 1 {
			why = append(why, "1 "+c.what)
		} else if c.n > 1 {
			why = append(why, fmt.Sprintf("%d %ss", c.n, c.what))
		}
	}
	return r, fmt.Errorf("%w: semaphore %q: %d missing slots not minted: Redis records %s",
		ErrRepairUnsafe, engine.Printable(h.name), len(r.Missing), strings.Join(why, ", "))
}
