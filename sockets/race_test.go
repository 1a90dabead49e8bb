//go:build race

package sockets

const raceEnabled = true
