// Package readmecheck holds the test that compiles README.md's Go snippets
// marked with the line
//
//	<!-- compiled by internal/readmecheck -->
//
// just before their ```go fence. A marked snippet is a whole file without
// its package clause: imports and declarations.
package readmecheck
