import { defineFenceSuite } from '../suites/fence.suite.js';
import { sqliteFixture } from '../support/dialects.js';

defineFenceSuite(sqliteFixture);
