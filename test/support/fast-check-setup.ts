import fc from 'fast-check';

/**
 * fast-check 4 keeps a failed property's error in `cause`, and vitest's JSON report (which CI
 * prints) shows only the message. With this, the message carries the error too, so a failure seen
 * once in CI can be read without reproducing it.
 */
fc.configureGlobal({ includeErrorInReport: true });
