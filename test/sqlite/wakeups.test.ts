import { defineWakeupSuite } from '../suites/wakeups.suite.js';
import { sqliteFixture } from '../support/dialects.js';

defineWakeupSuite(sqliteFixture);
