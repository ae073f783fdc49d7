// Package apidocs holds the test that keeps the prose of the module true to
// its API: every qualified name of one of the module's packages written in
// the README, the docs/ pages, the CHANGELOG's current text and every Go
// comment (package docs, examples) must exist.
package apidocs
