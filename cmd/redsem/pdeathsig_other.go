//go:build unix && !linux

package main

import "syscall"

// childAttr puts the command in its own process group. There is no
// parent-death signal outside Linux: the guard process alone stops the
// command if redsem dies.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
