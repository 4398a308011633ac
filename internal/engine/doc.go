// Package engine holds what the semaphore (package redsem), the rate gate
// (package rate) and the operators' package (admin) share: the acquisition
// driver every wait and try runs (driver.go), how a script is declared,
// named, resolved and run by EVALSHA (script.go, header.go, lua/ and the
// resolved scripts/), the key encoding under one hash tag, the mapping of
// the scripts' error replies to sentinel errors, and the limits. It is internal: its API follows what
// those packages need.
package engine
