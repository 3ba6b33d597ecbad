import { defineWakeupSuite } from '../suites/wakeups.suite.js';
import { postgresFixture } from '../support/dialects.js';

defineWakeupSuite(postgresFixture);
