// Package admin holds the operators' side of redsem: reading, checking,
// repairing, resizing and deleting a semaphore or read-write lock without
// taking part in it, scanning a prefix for every semaphore, read-write lock
// and rate gate (ScanNames, ReadFleet), listing and removing every key of a
// name whatever its kind and type (Kinds, Keys, Purge), checking the server
// (CheckServer), the Redis commands a client needs (ACLCommands), and
// Counters, a ready-made redsem.Observer.
//
// A service that only takes and gives back permits needs none of it; the
// redsem command, redsem top and the Prometheus exporter are built on it.
//
// Nothing here needs a semaphore's size: every operation works on the size
// stored in Redis. The errors are redsem's sentinels, the very same values
// (redsem.ErrWrongType, redsem.ErrCorrupt, redsem.ErrInvalidName,
// redsem.ErrInvalidOption, ...), so match them with errors.Is as usual.
// This package does not import package redsem, so it takes a Pool of its
// own with the same method set: a redsem.Pool serves.
package admin
