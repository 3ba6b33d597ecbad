import { defineOtelTraceSuite } from '../suites/otel-trace.suite.js';
import { postgresFixture } from '../support/dialects.js';

defineOtelTraceSuite(postgresFixture);
