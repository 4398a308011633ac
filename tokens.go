package redsem

import "github.com/redsem/redsem/internal/engine"

// Tokens are "<epoch>:<slot>", slot 1..size. The epoch is 12 hex digits drawn
// at random by the client that created the semaphore; a semaphore created
// again (after Delete, or after Redis lost its data) gets a new epoch, so a
// token of an older generation is recognised and dropped, as is any string a
// rogue client pushes onto the list (FM-22). A token is granted only while no
// lease holds it, so a duplicate can never make an (N+1)-th holder.
//
// Every acquisition carries a random 128-bit id, chosen by the client before
// its first command. The lease is recorded under it, Release and Refresh are
// checked against it, and an acquisition whose reply was lost is settled by it.

func newAcqID() string { return engine.NewAcqID() }

// validToken mirrors is_valid in common.lua (engine.ValidToken).
func validToken(tok, epoch string, size int) bool { return engine.ValidToken(tok, epoch, size) }
