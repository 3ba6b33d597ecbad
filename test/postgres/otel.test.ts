import { defineOtelSuite } from '../suites/otel.suite.js';
import { postgresFixture } from '../support/dialects.js';

defineOtelSuite(postgresFixture);
