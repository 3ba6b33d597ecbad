import { defineLifecycleSuite } from '../suites/lifecycle.suite.js';
import { postgresFixture } from '../support/dialects.js';

defineLifecycleSuite(postgresFixture);
