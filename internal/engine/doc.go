// Package engine holds what the semaphore (package redsem) and the rate gate
// (package rate) share: the Redis scripts and their loading, the key
// encoding under one hash tag, the script call with its one retry on a dead
// pooled connection, the mapping of the scripts' error replies to sentinel
// errors, and the limits both apply. It is internal: its API follows what
// those two packages need.
package engine
